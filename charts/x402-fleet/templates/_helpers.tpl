{{/* Names ------------------------------------------------------------------------------ */}}

{{- define "x402-fleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* <release>-x402-fleet, or the release name when it already contains the chart name. Capped so
     that "<fullname>-operator" and friends stay within 63 characters. */}}
{{- define "x402-fleet.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "x402-fleet.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "x402-fleet.routingConfigMap" -}}
{{- default (printf "%s-routing" (include "x402-fleet.fullname" .)) .Values.router.routingTable.configMapName -}}
{{- end -}}

{{- /* The Secret of the token the router presents to the facilitators (services/platform/router-token.ts). */ -}}
{{- define "x402-fleet.routerTokenSecret" -}}
{{- default (printf "%s-router-token" (include "x402-fleet.fullname" .)) .Values.router.facilitatorToken.existingSecret -}}
{{- end -}}

{{- /* The router pods' selector labels as k=v,k=v (X402_ROUTER_POD_LABELS: the operator's NetworkPolicies admit them). */ -}}
{{- define "x402-fleet.routerPodLabels" -}}
{{- $labels := fromYaml (include "x402-fleet.selectorLabels" (dict "ctx" . "component" "router")) -}}
{{- $pairs := list -}}
{{- range $k := keys $labels | sortAlpha }}{{ $pairs = append $pairs (printf "%s=%s" $k (get $labels $k)) }}{{ end -}}
{{- join "," $pairs -}}
{{- end -}}

{{- /* The namespace the operator serves: operator.watchNamespace, else the release's; "" with
       operator.clusterWide (every namespace). */ -}}
{{- define "x402-fleet.watchNamespace" -}}
{{- if .Values.operator.clusterWide -}}
{{- if .Values.operator.watchNamespace -}}
{{- fail "operator.clusterWide and operator.watchNamespace exclude each other: every namespace, or one" -}}
{{- end -}}
{{- else -}}
{{- default .Release.Namespace .Values.operator.watchNamespace -}}
{{- end -}}
{{- end -}}

{{- define "x402-fleet.operatorServiceAccount" -}}
{{- if .Values.operator.serviceAccount.create -}}
{{- default (printf "%s-operator" (include "x402-fleet.fullname" .)) .Values.operator.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.operator.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "x402-fleet.walletsDatabaseSecret" -}}
{{- default (printf "%s-wallets-database" (include "x402-fleet.fullname" .)) .Values.wallets.database.existingSecret -}}
{{- end -}}

{{- define "x402-fleet.hubDatabaseSecret" -}}
{{- default (printf "%s-hub-database" (include "x402-fleet.fullname" .)) .Values.hub.database.existingSecret -}}
{{- end -}}

{{- define "x402-fleet.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* Labels ----------------------------------------------------------------------------- */}}

{{- define "x402-fleet.labels" -}}
helm.sh/chart: {{ include "x402-fleet.chart" . }}
app.kubernetes.io/name: {{ include "x402-fleet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: x402-fleet
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* (dict "ctx" $ "component" "router") */}}
{{- define "x402-fleet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "x402-fleet.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "x402-fleet.componentLabels" -}}
{{ include "x402-fleet.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Restricted Pod Security ----------------------------------------------------------- */}}

{{- define "x402-fleet.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "x402-fleet.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop:
    - ALL
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Probes on the admin port: /healthz for startup and liveness, /readyz for readiness. The
     admin port opens once the service's store is open and migrated: on real nodes that took 29 s
     for a facilitator creating its embedded store and 45 s for wallets on a loaded machine, so the
     startup window (2 s x 90 = 180 s) is four times the slowest start, probed often enough to turn
     Ready within seconds. Timeouts of 3 s (5 s for liveness): a busy process (an embedded store
     runs on the event loop) may hold /healthz a moment; a restart needs a minute of silence. The
     operator's facilitator pods use the same timings (operator/builders.ts PROBE_TIMINGS). */}}
{{- define "x402-fleet.probes" -}}
startupProbe:
  httpGet:
    path: /healthz
    port: admin
  periodSeconds: 2
  timeoutSeconds: 3
  failureThreshold: 90
livenessProbe:
  httpGet:
    path: /healthz
    port: admin
  periodSeconds: 20
  timeoutSeconds: 5
  failureThreshold: 3
readinessProbe:
  httpGet:
    path: /readyz
    port: admin
  periodSeconds: 10
  timeoutSeconds: 3
  failureThreshold: 3
{{- end -}}

{{/* Pod scheduling knobs shared by every component: (dict "ctx" $ "v" .Values.router) */}}
{{- define "x402-fleet.podScheduling" -}}
{{- with .v.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .v.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .v.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .v.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .ctx.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Soft spread over the topology keys: (dict "ctx" $ "component" "router" "spread" .Values.router.topologySpread) */}}
{{- define "x402-fleet.topologySpread" -}}
{{- $ctx := .ctx -}}
{{- $component := .component -}}
{{- $spread := .spread -}}
topologySpreadConstraints:
{{- range $spread.topologyKeys }}
  - maxSkew: {{ $spread.maxSkew }}
    topologyKey: {{ . }}
    whenUnsatisfiable: {{ $spread.whenUnsatisfiable }}
    labelSelector:
      matchLabels:
        {{- include "x402-fleet.selectorLabels" (dict "ctx" $ctx "component" $component) | nindent 8 }}
    matchLabelKeys:
      - pod-template-hash
{{- end }}
{{- end -}}

{{/* Ingress: (dict "ctx" $ "component" "router" "ingress" .Values.router.ingress "service" "<name>") */}}
{{- define "x402-fleet.ingress" -}}
{{- $service := .service -}}
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: {{ $service }}
  namespace: {{ .ctx.Release.Namespace }}
  labels:
    {{- include "x402-fleet.componentLabels" (dict "ctx" .ctx "component" .component) | nindent 4 }}
  {{- with .ingress.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  {{- with .ingress.className }}
  ingressClassName: {{ . }}
  {{- end }}
  {{- with .ingress.tls }}
  tls:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  rules:
    {{- range .ingress.hosts }}
    - host: {{ .host | quote }}
      http:
        paths:
          {{- range .paths }}
          - path: {{ .path }}
            pathType: {{ .pathType }}
            backend:
              service:
                name: {{ $service }}
                port:
                  name: http
          {{- end }}
    {{- end }}
{{- end -}}
