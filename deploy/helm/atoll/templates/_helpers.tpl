{{/* The image reference. */}}
{{- define "atoll.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}

{{/* Labels every object carries. */}}
{{- define "atoll.labels" -}}
app.kubernetes.io/name: atoll
app.kubernetes.io/part-of: atoll
app.kubernetes.io/version: {{ .Values.image.tag | quote }}
{{- end -}}

{{/* The node affinity of edge nodes (edge: true) or cloud nodes (edge: false). */}}
{{- define "atoll.edgeAffinity" -}}
nodeAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    nodeSelectorTerms:
{{- if .edge }}
    - matchExpressions:
      - key: {{ .root.Values.edgeLabels.kubeedge }}
        operator: Exists
    - matchExpressions:
      - key: {{ .root.Values.edgeLabels.openyurt }}
        operator: In
        values: ["true"]
{{- else }}
    - matchExpressions:
      - key: {{ .root.Values.edgeLabels.kubeedge }}
        operator: DoesNotExist
      - key: {{ .root.Values.edgeLabels.openyurt }}
        operator: NotIn
        values: ["true"]
{{- end }}
{{- end -}}
