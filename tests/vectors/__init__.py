"""Plain data tables shared by the unit tests and the apiserver (CEL) tests."""
