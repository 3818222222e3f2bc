{{/* Container running `quoter conformance` against the serving URL: (dict "ctx" $ "quick" bool "timeout" "60s"). */}}
{{- define "pn.conformanceContainer" -}}
- name: conformance
  image: {{ include "pn.image" .ctx }}
  imagePullPolicy: {{ .ctx.Values.epp.image.pullPolicy }}
  command: ["quoter"]
  args:
    - conformance
    - --url={{ include "pn.servingURL" .ctx }}
    - --model={{ include "pn.servedName" .ctx }}
    - --timeout={{ .timeout }}
    {{- if .quick }}
    - --quick
    {{- end }}
  securityContext:
    runAsNonRoot: true
    runAsUser: 65532
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities:
      drop: ["ALL"]
    seccompProfile:
      type: RuntimeDefault
  resources:
    requests:
      cpu: 50m
      memory: 32Mi
    limits:
      memory: 128Mi
{{- end -}}
