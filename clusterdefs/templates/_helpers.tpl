{{/*
pika-cluster.name: the Cluster's name: nameOverride or the release name, checked against KubeBlocks' limits.
*/}}
{{- define "pika-cluster.name" -}}
{{- $name := .Values.nameOverride | default .Release.Name -}}
{{- if gt (len $name) 16 -}}
{{- fail (printf "cluster name %q is longer than 16 characters" $name) -}}
{{- end -}}
{{- if not (regexMatch "^[a-z]([a-z0-9-]*[a-z0-9])?$" $name) -}}
{{- fail (printf "cluster name %q must be lower-case letters, digits and '-', starting with a letter" $name) -}}
{{- end -}}
{{ $name }}
{{- end }}

{{/*
pika-cluster.labels: the labels of the Cluster object.
*/}}
{{- define "pika-cluster.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
pika-cluster.volume: a data volumeClaimTemplate. Argument: (list . "<size>").
*/}}
{{- define "pika-cluster.volume" -}}
{{- $root := index . 0 -}}
- name: data
  spec:
    {{- with $root.Values.storageClassName }}
    storageClassName: {{ . }}
    {{- end }}
    accessModes:
      - ReadWriteOnce
    resources:
      requests:
        storage: {{ index . 1 }}
{{- end }}
