//go:build tools

// Package tools pins what the provider's main.go and generate.go import; hack/build-pulumi.sh copies
// those two files (with the schema they embed) from the module cache at build time.
package tools

import (
	_ "github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/provider"
	_ "github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/version"
	_ "github.com/pulumi/pulumi/pkg/v3/codegen/schema"
)
