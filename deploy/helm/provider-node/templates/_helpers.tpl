{{/* Names, labels and derived values shared by every template. */}}

{{- define "pn.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "pn.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one component: (dict "ctx" $ "component" "epp"). */}}
{{- define "pn.selector" -}}
app.kubernetes.io/name: {{ .ctx.Chart.Name }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "pn.engine" -}}
{{- if not (has .Values.engine (list "vllm" "sglang")) -}}
{{- fail (printf "engine must be vllm or sglang, not %q" .Values.engine) -}}
{{- end -}}
{{- .Values.engine -}}
{{- end -}}

{{- define "pn.modelID" -}}
{{- required "model.id is required (the Hugging Face model id, e.g. Qwen/Qwen3-32B)" .Values.model.id -}}
{{- end -}}

{{- define "pn.servedName" -}}
{{- default (include "pn.modelID" .) .Values.model.servedName -}}
{{- end -}}

{{/* blockSize is the one source of the engine block/page size and the EPP's. */}}
{{- define "pn.blockSize" -}}
{{- $b := int .Values.blockSize -}}
{{- if or (lt $b 1) (gt $b 128) -}}
{{- fail (printf "blockSize must be between 1 and 128, not %v" .Values.blockSize) -}}
{{- end -}}
{{- $b -}}
{{- end -}}

{{- define "pn.mode" -}}
{{- if not (has .Values.mode (list "standalone" "gateway")) -}}
{{- fail (printf "mode must be standalone or gateway, not %q" .Values.mode) -}}
{{- end -}}
{{- .Values.mode -}}
{{- end -}}

{{- define "pn.image" -}}
{{- printf "%s:%s" .Values.epp.image.repository (default .Chart.AppVersion .Values.epp.image.tag) -}}
{{- end -}}

{{- define "pn.servingURL" -}}
{{- if .Values.servingURL -}}
{{- .Values.servingURL | trimSuffix "/" -}}
{{- else if eq (include "pn.mode" .) "standalone" -}}
{{- printf "http://%s-proxy.%s.svc:%v" (include "pn.fullname" .) .Release.Namespace .Values.standalone.service.port -}}
{{- else -}}
{{- required "servingURL is required in gateway mode (the Gateway's public URL of this model)" .Values.servingURL -}}
{{- end -}}
{{- end -}}

{{- define "pn.eppAdminURL" -}}
{{- printf "%s://%s-epp.%s.svc:%v" (ternary "https" "http" (eq (include "pn.adminAuth" .) "mtls")) (include "pn.fullname" .) .Release.Namespace .Values.epp.ports.admin -}}
{{- end -}}

{{/* How the EPP admin port authenticates its readers (docs/security.md). */}}
{{- define "pn.adminAuth" -}}
{{- $a := .Values.epp.admin.auth -}}
{{- if not (has $a (list "token" "mtls" "none")) }}{{ fail "epp.admin.auth must be token, mtls or none" }}{{ end -}}
{{- $a -}}
{{- end -}}

{{- define "pn.adminTokenSecret" -}}
{{- required "epp.admin.token.existingSecret is required with epp.admin.auth token: a Secret holding a random token (deploy/install.sh creates it with kubectl); tokens are never chart values" .Values.epp.admin.token.existingSecret -}}
{{- end -}}

{{/* The admin certificates' Secret (tls.crt, tls.key, ca.crt). */}}
{{- define "pn.adminTLSSecret" -}}
{{- required "epp.admin.mtls.existingSecret is required with epp.admin.auth mtls: a Secret with tls.crt, tls.key and ca.crt (e.g. a cert-manager Certificate's)" .Values.epp.admin.mtls.existingSecret -}}
{{- end -}}

{{/* The name every reader verifies in the admin certificate. */}}
{{- define "pn.adminServerName" -}}
{{- include "pn.fullname" . }}-epp-admin
{{- end -}}

{{- define "pn.calibrationTokenSecret" -}}
{{- required "quoter.calibration.tokenSecret is required with calibration on: a Secret holding a random token (deploy/install.sh creates it with kubectl)" .Values.quoter.calibration.tokenSecret -}}
{{- end -}}

{{/* Arguments of a reader of the EPP admin port (quoter, calibration Job). */}}
{{- define "pn.adminClientArgs" -}}
{{- $a := include "pn.adminAuth" . -}}
{{- if eq $a "token" }}
- --capacity-token-file=/etc/omnious-admin/{{ .Values.epp.admin.token.key }}
{{- else if eq $a "mtls" }}
- --capacity-ca-file=/etc/omnious-admin/ca.crt
- --capacity-cert-file=/etc/omnious-admin/tls.crt
- --capacity-key-file=/etc/omnious-admin/tls.key
- --capacity-server-name={{ include "pn.adminServerName" . }}
{{- end }}
{{- end -}}

{{/* The admin credentials' volume (name admin-credentials), "" with auth none. */}}
{{- define "pn.adminVolume" -}}
{{- $a := include "pn.adminAuth" . -}}
{{- if eq $a "token" }}
- name: admin-credentials
  secret:
    secretName: {{ include "pn.adminTokenSecret" . }}
    defaultMode: 0444
    items:
      - key: {{ .Values.epp.admin.token.key }}
        path: {{ .Values.epp.admin.token.key }}
{{- else if eq $a "mtls" }}
- name: admin-credentials
  secret:
    secretName: {{ include "pn.adminTLSSecret" . }}
    defaultMode: 0444
    items:
      - {key: tls.crt, path: tls.crt}
      - {key: tls.key, path: tls.key}
      - {key: ca.crt, path: ca.crt}
{{- end }}
{{- end -}}

{{- define "pn.quoterSecret" -}}
{{- required "quoter.existingSecret is required: create the key Secret with kubectl (deploy/install.sh does) and pass its name; keys are never chart values" .Values.quoter.existingSecret -}}
{{- end -}}

{{/* Whether an optional API may be rendered: (dict "ctx" $ "api" "keda.sh/v1alpha1" "force" bool). */}}
{{- define "pn.hasAPI" -}}
{{- if or .force (.ctx.Capabilities.APIVersions.Has .api) -}}true{{- end -}}
{{- end -}}

{{/* A Go duration value, checked: (dict "name" "quoter.slo.ttftP95" "value" "2s"). */}}
{{- define "pn.duration" -}}
{{- $v := toString .value -}}
{{- if not (regexMatch "^(([0-9]+(\\.[0-9]*)?|\\.[0-9]+)(ns|us|µs|ms|s|m|h))+$" $v) -}}
{{- fail (printf "%s must be a Go duration such as 2s or 50ms, not %q" .name $v) -}}
{{- end -}}
{{- if not (regexMatch "[1-9]" $v) -}}
{{- fail (printf "%s must be above zero, not %q" .name $v) -}}
{{- end -}}
{{- $v -}}
{{- end -}}

{{/* The calibration ConfigMap, written by `quoter calibrate` and mounted into the quoter. */}}
{{- define "pn.calibrationConfigMap" -}}
{{- include "pn.fullname" . }}-calibration
{{- end -}}

{{- define "pn.calibrationEnabled" -}}
{{- if and .Values.quoter.enabled .Values.quoter.calibration.enabled -}}true{{- end -}}
{{- end -}}
