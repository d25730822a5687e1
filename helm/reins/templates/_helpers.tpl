{{/* Names and labels. */}}
{{- define "reins.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "reins.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "reins.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "reins.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: reins
{{- end }}

{{/* Selector labels of one component: include with (dict "ctx" $ "component" "router"). */}}
{{- define "reins.selectorLabels" -}}
app.kubernetes.io/name: {{ include "reins.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "reins.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The workers' image: held at worker.imageTag during step 1 of a record-schema upgrade. */}}
{{- define "reins.workerImage" -}}
{{ .Values.image.repository }}:{{ .Values.worker.imageTag | default .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "reins.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "reins.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
What every reins pod's spec shares: its ServiceAccount, without an API token (reins never calls
the Kubernetes API), and its spread over the topology keys of .Values.topologySpread.
Include with (dict "ctx" $ "component" "router").
*/}}
{{- define "reins.podSpec" -}}
serviceAccountName: {{ include "reins.serviceAccountName" .ctx }}
automountServiceAccountToken: {{ .ctx.Values.serviceAccount.automountToken }}
{{- $component := .component }}
{{- $ctx := .ctx }}
{{- with .ctx.Values.topologySpread }}
topologySpreadConstraints:
{{- range . }}
  - maxSkew: {{ .maxSkew }}
    topologyKey: {{ .topologyKey }}
    whenUnsatisfiable: {{ .whenUnsatisfiable }}
    labelSelector:
      matchLabels:
        {{- include "reins.selectorLabels" (dict "ctx" $ctx "component" $component) | nindent 8 }}
{{- end }}
{{- end }}
{{- end }}

{{- define "reins.tenantsPath" -}}
/etc/reins/{{ .Values.tenants.fileName }}
{{- end }}

{{/* Arguments of `reins config apply` in the router's init container. */}}
{{- define "reins.configArgs" -}}
- {{ include "reins.tenantsPath" . }}
{{- if .Values.gates.config }}
- --gates={{ include "reins.gatesPath" . }}
{{- end }}
{{- end }}

{{/*
The REINS_* environment of every reins container: the one list of settings (kernel/settings.py).
A setting with its own value (URLs, concurrency, drain grace, the metrics and probe endpoints) is
set here by name; no process gets REINS_TENANTS_FILE: the fleet's configuration is the document
in Redis, applied at router boot;
every other one comes from .Values.settings, so a new setting is one line in values.yaml.
*/}}
{{- define "reins.env" -}}
{{- $own := list "redis_url" "broker_url" "tenants_file" "worker_concurrency" "drain_grace_s" "metrics_port" "metrics_host" "metrics_worker_label" "health_port" "health_host" "public_url" "trusted_proxies" }}
{{- range $key, $_ := .Values.settings }}
{{- if has $key $own }}
{{- fail (printf "settings.%s has its own value in values.yaml (see store, broker, tenants, worker, metrics, health, api); remove it from settings" $key) }}
{{- end }}
{{- if not (regexMatch "^[a-z][a-z0-9_]*$" $key) }}
{{- fail (printf "settings.%s: keys are kernel/settings.py field names (lower_snake_case)" $key) }}
{{- end }}
{{- end -}}
- name: PROMETHEUS_DISABLE_CREATED_SERIES  # prometheus_client: no *_created series
  value: "True"
- name: REINS_REDIS_URL
{{- if .Values.store.existingSecret }}
  valueFrom:
    secretKeyRef:
      name: {{ .Values.store.existingSecret }}
      key: {{ .Values.store.existingSecretKey }}
{{- else }}
  value: {{ required "store.redisUrl is required" .Values.store.redisUrl | quote }}
{{- end }}
- name: REINS_BROKER_URL
{{- if .Values.broker.existingSecret }}
  valueFrom:
    secretKeyRef:
      name: {{ .Values.broker.existingSecret }}
      key: {{ .Values.broker.existingSecretKey }}
{{- else }}
  value: {{ required "broker.url is required" .Values.broker.url | quote }}
{{- end }}
- name: REINS_WORKER_CONCURRENCY
  value: {{ .Values.worker.concurrency | int | toString | quote }}
- name: REINS_DRAIN_GRACE_S
  value: {{ .Values.worker.drainGraceSeconds | toString | quote }}
- name: REINS_METRICS_PORT
  value: {{ required "metrics.port is required (every pod serves /metrics)" .Values.metrics.port | int | toString | quote }}
- name: REINS_METRICS_HOST
  value: {{ .Values.metrics.host | default "0.0.0.0" | quote }}
- name: REINS_METRICS_WORKER_LABEL  # the worker label of its series: outlives every pod
  value: {{ .Values.metrics.workerLabel | default (printf "%s-worker" (include "reins.fullname" .)) | quote }}
- name: REINS_HEALTH_PORT
  value: {{ required "health.port is required (the probes use it)" .Values.health.port | int | toString | quote }}
- name: REINS_HEALTH_HOST
  value: {{ .Values.health.host | default "0.0.0.0" | quote }}
- name: REINS_PUBLIC_URL
  value: {{ include "reins.publicUrl" . | quote }}
- name: REINS_TRUSTED_PROXIES
  value: {{ join "," .Values.api.trustedProxies | quote }}
{{- range $key, $value := .Values.settings }}
{{- if not (kindIs "invalid" $value) }}
- name: REINS_{{ upper $key }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- end }}
{{- end }}

{{- define "reins.gatesPath" -}}
/etc/reins/{{ .Values.gates.fileName }}
{{- end }}

{{/* Arguments: the pod's name is its ring member (worker) or replica (router) name. */}}
{{- define "reins.routerArgs" -}}
- --name=$(POD_NAME)
{{- with .Values.router.extraArgs }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "reins.workerArgs" -}}
- --name=$(POD_NAME)
{{- with .Values.worker.extraArgs }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Pod annotations: scrape hints and a checksum of the configuration, so a change rolls pods; then
the component's podAnnotations. One map, so a key given twice is one key (the value's wins).
*/}}
{{- define "reins.podAnnotations" -}}
{{- $out := dict "checksum/config" (include (print .ctx.Template.BasePath "/configmap.yaml") .ctx | sha256sum) }}
{{- if .ctx.Values.metrics.scrapeAnnotations }}
{{- $_ := set $out "prometheus.io/scrape" "true" }}
{{- $_ := set $out "prometheus.io/port" (toString .ctx.Values.metrics.port) }}
{{- $_ := set $out "prometheus.io/path" .ctx.Values.metrics.path }}
{{- end }}
{{- toYaml (mergeOverwrite $out (.extra | default dict)) }}
{{- end }}

{{/* Worker grace: long enough to drain (REINS_DRAIN_GRACE_S) plus hand-back and deregistration. */}}
{{- define "reins.workerGraceSeconds" -}}
{{- add (.Values.worker.drainGraceSeconds | ceil | int) (.Values.worker.terminationExtraSeconds | int) }}
{{- end }}

{{/* REINS_PUBLIC_URL: api.publicUrl; else the Ingress's host, https with its TLS; else empty
(the address each request names). */}}
{{- define "reins.publicUrl" -}}
{{- if .Values.api.publicUrl }}
{{- .Values.api.publicUrl }}
{{- else if and .Values.ingress.enabled .Values.ingress.host }}
{{- printf "%s://%s" (ternary "https" "http" (not (empty .Values.ingress.tls))) .Values.ingress.host }}
{{- end }}
{{- end }}
