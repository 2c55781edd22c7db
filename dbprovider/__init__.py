"""The `dbprovider` command: one console script for the manager, the renderer and the local stack."""
