{{/*
pika.name: the chart's name, which is also the addon's name and the ClusterDefinition's name.
*/}}
{{- define "pika.name" -}}
{{ .Chart.Name }}
{{- end }}

{{/*
pika.labels: the labels every object of the addon carries.
*/}}
{{- define "pika.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "pika.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
pika.apiVersionAnnotation: the annotation without which KubeBlocks ignores a ClusterDefinition, ComponentDefinition,
ComponentVersion or ShardingDefinition (it never reconciles them, so they never become Available): the API version
the object was written for.
*/}}
{{- define "pika.apiVersionAnnotation" -}}
kubeblocks.io/crd-api-version: apps.kubeblocks.io/v1
{{- end }}

{{/*
pika.annotations: the annotations of the component and sharding definitions: the API version KubeBlocks needs, kept
on uninstall (clusters still use them) and exempt from KubeBlocks' immutability check so that an upgrade of the same
chart version can fix them.
*/}}
{{- define "pika.annotations" -}}
{{ include "pika.apiVersionAnnotation" . }}
helm.sh/resource-policy: keep
apps.kubeblocks.io/skip-immutable-check: "true"
{{- end }}

{{/*
pika.unversionedAnnotations: the annotations of the ClusterDefinition and the ComponentVersions, whose names carry no
chart version: the API version KubeBlocks needs, and kept on uninstall.
*/}}
{{- define "pika.unversionedAnnotations" -}}
{{ include "pika.apiVersionAnnotation" . }}
helm.sh/resource-policy: keep
{{- end }}

{{/*
pika.kubeblocksLine: the KubeBlocks line the definitions target, "1.0" or "1.1"; anything else stops the install, and
so does a KubeBlocks of the other line running in the release namespace (pika.checkInstalledLine), unless
kubeblocksLineCheck is false.
*/}}
{{- define "pika.kubeblocksLine" -}}
{{- $line := toString .Values.kubeblocksLine -}}
{{- if not (has $line (list "1.0" "1.1")) -}}
{{- fail (printf "kubeblocksLine must be \"1.0\" or \"1.1\", not %q" $line) -}}
{{- end -}}
{{- if .Values.kubeblocksLineCheck -}}
{{- include "pika.checkInstalledLine" (list . $line) -}}
{{- end -}}
{{ $line }}
{{- end }}

{{/*
pika.checkInstalledLine: fails the install when the KubeBlocks deployment of the release namespace (labels
app.kubernetes.io/name=kubeblocks, app.kubernetes.io/component=apps, as kbcli finds it; its version in
app.kubernetes.io/version) is of another line than the one asked for. Argument: (list . "<line>"). Nothing is
checked where lookup sees no cluster (helm template, helm lint) or no such deployment (KubeBlocks installed in
another namespace): pika-action then refuses at the first action (exit 2 naming KUBEBLOCKS_LINE).
*/}}
{{- define "pika.checkInstalledLine" -}}
{{- $root := index . 0 -}}
{{- $line := index . 1 -}}
{{- $deployments := lookup "apps/v1" "Deployment" $root.Release.Namespace "" -}}
{{- range ($deployments.items | default list) -}}
{{- $labels := .metadata.labels | default dict -}}
{{- $version := get $labels "app.kubernetes.io/version" | trimPrefix "v" -}}
{{- if and (eq (get $labels "app.kubernetes.io/name") "kubeblocks") (eq (get $labels "app.kubernetes.io/component") "apps") $version -}}
{{- $running := "" -}}
{{- if semverCompare "~1.0.0-0" $version -}}
{{- $running = "1.0" -}}
{{- else if semverCompare ">=1.1.0-0" $version -}}
{{- $running = "1.1" -}}
{{- else -}}
{{- fail (printf "KubeBlocks %s (deployment %s/%s) is older than 1.0, which this addon needs" $version .metadata.namespace .metadata.name) -}}
{{- end -}}
{{- if ne $running $line -}}
{{- fail (printf "kubeblocksLine is %q but KubeBlocks %s runs in %s (deployment %s): install the addon with --set kubeblocksLine=%s" $line $version .metadata.namespace .metadata.name $running) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/*
pika.versioned: a definition's name followed by the chart version, e.g. pika-group-0.1.0. Argument: (list . "pika-group").
*/}}
{{- define "pika.versioned" -}}
{{ index . 1 }}-{{ (index . 0).Chart.Version }}
{{- end }}

{{/*
pika.matching: the regular expression that matches a definition's name in every chart version,
e.g. ^pika-group-[0-9]. Argument: the unversioned name.
*/}}
{{- define "pika.matching" -}}
^{{ . }}-[0-9]
{{- end }}

{{/*
pika.groupCmpdName: the ComponentDefinition of a pika shard (a Codis group).
*/}}
{{- define "pika.groupCmpdName" -}}
{{ include "pika.versioned" (list . "pika-group") }}
{{- end }}

{{/*
pika.dashboardCmpdName: the ComponentDefinition of codis-dashboard.
*/}}
{{- define "pika.dashboardCmpdName" -}}
{{ include "pika.versioned" (list . "pika-codis-dashboard") }}
{{- end }}

{{/*
pika.proxyCmpdName: the ComponentDefinition of codis-proxy.
*/}}
{{- define "pika.proxyCmpdName" -}}
{{ include "pika.versioned" (list . "pika-codis-proxy") }}
{{- end }}

{{/*
pika.feCmpdName: the ComponentDefinition of codis-fe.
*/}}
{{- define "pika.feCmpdName" -}}
{{ include "pika.versioned" (list . "pika-codis-fe") }}
{{- end }}

{{/*
pika.etcdCmpdName: the ComponentDefinition of the etcd that coordinates Codis and holds pika-action's locks.
*/}}
{{- define "pika.etcdCmpdName" -}}
{{ include "pika.versioned" (list . "pika-etcd") }}
{{- end }}

{{/*
pika.shardingDefName: the ShardingDefinition of the pika shards.
*/}}
{{- define "pika.shardingDefName" -}}
{{ include "pika.versioned" (list . "pika-sharding") }}
{{- end }}

{{/*
pika.configTemplateName: the ConfigMap holding pika.conf and the exporter's info.toml.
*/}}
{{- define "pika.configTemplateName" -}}
{{ include "pika.versioned" (list . "pika-group-config") }}
{{- end }}

{{/*
pika.codisConfigTemplateName: the ConfigMap holding dashboard.toml and proxy.toml.
*/}}
{{- define "pika.codisConfigTemplateName" -}}
{{ include "pika.versioned" (list . "pika-codis-config") }}
{{- end }}

{{/*
pika.scriptsTemplateName: the ConfigMap holding the addon's few scripts (scripts/).
*/}}
{{- define "pika.scriptsTemplateName" -}}
{{ include "pika.versioned" (list . "pika-scripts") }}
{{- end }}

{{/*
pika.paramsDefName: the ParametersDefinition of pika.conf.
*/}}
{{- define "pika.paramsDefName" -}}
{{ include "pika.versioned" (list . "pika-group-pd") }}
{{- end }}

{{/*
pika.backupActionSetName: the ActionSet of a full backup of one pika shard.
*/}}
{{- define "pika.backupActionSetName" -}}
{{ include "pika.versioned" (list . "pika-full-backup") }}
{{- end }}

{{/*
pika.imageRef: an image reference from an entry of .Values.image. Argument: (list . .Values.image.pika).
An entry may name its own registry; an empty tag falls back to the chart's appVersion.
*/}}
{{- define "pika.imageRef" -}}
{{- $root := index . 0 -}}
{{- $img := index . 1 -}}
{{- $registry := $img.registry | default $root.Values.image.registry -}}
{{ $registry }}/{{ $img.repository }}:{{ $img.tag | default $root.Chart.AppVersion }}
{{- end }}

{{/*
pika.pikaImage: the pika server image.
*/}}
{{- define "pika.pikaImage" -}}
{{ include "pika.imageRef" (list . .Values.image.pika) }}
{{- end }}

{{/*
pika.exporterImage: the pika_exporter image.
*/}}
{{- define "pika.exporterImage" -}}
{{ include "pika.imageRef" (list . .Values.image.exporter) }}
{{- end }}

{{/*
pika.codisImage: the Codis image (dashboard, proxy, fe and codis-admin).
*/}}
{{- define "pika.codisImage" -}}
{{ include "pika.imageRef" (list . .Values.image.codis) }}
{{- end }}

{{/*
pika.etcdImage: the etcd image (3.5, distroless).
*/}}
{{- define "pika.etcdImage" -}}
{{ include "pika.imageRef" (list . .Values.image.etcd) }}
{{- end }}

{{/*
pika.busyboxImage: the static busybox copied into the etcd pods.
*/}}
{{- define "pika.busyboxImage" -}}
{{ include "pika.imageRef" (list . .Values.image.busybox) }}
{{- end }}

{{/*
pika.actionImage: the pika-action image. KubeBlocks allows one exec image per component, so every action of the
pika shards (sharding actions included) names this one; its tag defaults to the chart version.
*/}}
{{- define "pika.actionImage" -}}
{{- $img := .Values.image.action -}}
{{ $img.registry | default .Values.image.registry }}/{{ $img.repository }}:{{ $img.tag | default .Chart.Version }}
{{- end }}

{{/*
pika.actionBin: where pika-action lives in its image (addon/Dockerfile puts it there).
*/}}
{{- define "pika.actionBin" -}}
/bin/pika-action
{{- end }}

{{/*
pika.action: one blocking lifecycle action running `pika-action <subcommand> [<argument>...]`.
Argument: (list . "<subcommand>" ["<argument>"...]). The timeout stays within KubeBlocks' 60 s cap; pika-action
stops a little earlier (ACTION_BUDGET_SECONDS) and exits 75 so that the next run resumes (switchover instead
finishes or gives up within that one call).
*/}}
{{- define "pika.action" -}}
{{- $root := index . 0 -}}
{{- if not (lt (int $root.Values.action.budgetSeconds) (int $root.Values.action.timeoutSeconds)) -}}
{{- fail "action.budgetSeconds must stay below action.timeoutSeconds" -}}
{{- end -}}
{{- if gt (int $root.Values.action.timeoutSeconds) 60 -}}
{{- fail "action.timeoutSeconds above 60 is cut to 60 by KubeBlocks anyway" -}}
{{- end -}}
timeoutSeconds: {{ int $root.Values.action.timeoutSeconds }}
exec:
  image: {{ include "pika.actionImage" $root }}
  command:
    - {{ include "pika.actionBin" $root }}
    {{- range (rest .) }}
    - {{ . }}
    {{- end }}
{{- end }}

{{/*
pika.ports: the fixed ports of every component, by name.
*/}}
{{- define "pika.ports" -}}
pika: 9221
exporter: 9121
dashboard: 18080
proxy: 19000
proxyAdmin: 11080
fe: 8080
etcdClient: 2379
etcdPeer: 2380
{{- end }}

{{/*
pika.port: one port from pika.ports. Argument: (list . "pika").
*/}}
{{- define "pika.port" -}}
{{ index (include "pika.ports" (index . 0) | fromYaml) (index . 1) | int }}
{{- end }}
