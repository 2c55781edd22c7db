"""The Pulumi program: a ComponentResource that installs the provider into one DB cluster."""
