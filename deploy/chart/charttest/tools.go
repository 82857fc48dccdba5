package charttest

// The InferencePool CRD the tests install comes from this module.
import _ "sigs.k8s.io/gateway-api-inference-extension/api/v1"
