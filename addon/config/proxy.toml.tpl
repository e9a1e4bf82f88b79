# codis-proxy. Product name and auth, the dashboard and the advertised addresses come from the command line.
product_name = "codis-demo"
product_auth = ""
session_auth = ""

admin_addr = "0.0.0.0:{{ include "pika.port" (list . "proxyAdmin") }}"
proto_type = "tcp4"
proxy_addr = "0.0.0.0:{{ include "pika.port" (list . "proxy") }}"

jodis_name = ""
jodis_addr = ""
jodis_auth = ""
jodis_timeout = "20s"
jodis_compatible = false

proxy_datacenter = ""
proxy_max_clients = {{ .Values.codis.proxy.maxClients | int }}
proxy_max_offheap_size = {{ .Values.codis.proxy.maxOffheapSize | quote }}
proxy_heap_placeholder = {{ .Values.codis.proxy.heapPlaceholder | quote }}

backend_ping_period = "5s"
backend_recv_bufsize = "128kb"
backend_recv_timeout = {{ .Values.codis.proxy.backendRecvTimeout | quote }}
backend_send_bufsize = "128kb"
backend_send_timeout = "30s"
backend_max_pipeline = 20480
# Reads go to a group's master only. The fork's dashboard puts every reachable server into its group's replica
# groups by itself (its health check), a replica in a full sync or in pika's error state too, and with reads from
# replica groups allowed a client would read nil or stale values from it.
backend_primary_only = true
backend_primary_parallel = 2
backend_replica_parallel = 2
backend_primary_quick = 1
backend_replica_quick = 1
backend_keepalive_period = "75s"
backend_number_databases = 1

# = pika default-slot-num.
max_slot_num = 1024

session_recv_bufsize = "128kb"
session_recv_timeout = "30m"
session_send_bufsize = "64kb"
session_send_timeout = "30s"
session_max_pipeline = 10000
session_keepalive_period = "75s"
session_break_on_failure = false

slowlog_log_slower_than = 100000
quick_cmd_list = ""
slow_cmd_list = ""

metrics_report_server = ""
metrics_report_period = "1s"
metrics_report_influxdb_server = ""
metrics_report_influxdb_period = "1s"
metrics_report_influxdb_username = ""
metrics_report_influxdb_password = ""
metrics_report_influxdb_database = ""
metrics_report_statsd_server = ""
metrics_report_statsd_period = "1s"
metrics_report_statsd_prefix = ""
max_delay_refresh_time_interval = "15s"
