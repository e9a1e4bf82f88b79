# codis-dashboard. The coordinator (etcd), product name, product auth and advertised address are given on the
# command line from the component's vars, so one file serves every cluster.
coordinator_name = "etcd"
# Replaced by the --etcd argument. The fork validates the file before it applies its arguments and exits with
# "invalid coordinator_addr" on an empty one, so the file must name some address.
coordinator_addr = "given-by-the-etcd-argument:2379"
product_name = "codis-demo"
product_auth = ""

admin_addr = "0.0.0.0:{{ include "pika.port" (list . "dashboard") }}"

# = pika default-slot-num.
max_slot_num = 1024

migration_method = {{ .Values.codis.dashboard.migrationMethod | quote }}
migration_parallel_slots = {{ .Values.codis.dashboard.migrationParallelSlots | int }}
migration_async_maxbulks = {{ .Values.codis.dashboard.migrationAsyncMaxbulks | int }}
migration_async_maxbytes = {{ .Values.codis.dashboard.migrationAsyncMaxbytes | quote }}
migration_async_numkeys = {{ .Values.codis.dashboard.migrationAsyncNumkeys | int }}
migration_timeout = {{ .Values.codis.dashboard.migrationTimeout | quote }}

# The fork's built-in failover. With pika-action's failover watcher on (failover.enabled), it is kept dormant (a check
# an hour, 127 of them before it acts), so that only the fenced watcher replaces a dead master; off, the fork's own
# HA acts. pika-action's switchover and rejoin keep either consistent with KubeBlocks' roles.
sentinel_check_server_state_interval = "10s"
{{- if .Values.failover.enabled }}
sentinel_check_master_failover_interval = "3600s"
sentinel_master_dead_check_times = 127
{{- else }}
sentinel_check_master_failover_interval = "2s"
sentinel_master_dead_check_times = 10
{{- end }}
sentinel_check_offline_server_interval = "2s"
sentinel_client_timeout = "10s"
sentinel_quorum = 2
sentinel_parallel_syncs = 1
sentinel_down_after = "30s"
sentinel_failover_timeout = "5m"
sentinel_notification_script = ""
sentinel_client_reconfig_script = ""
