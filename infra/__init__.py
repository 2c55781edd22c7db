"""Installing the provider: manifests rendered from templates/, and the Pulumi program around them.

- `infra.crds`: CRD schemas generated from the domain models (domain.specs, domain.status).
- `infra.render`: `render_manifests(config)` / `render_prometheus_rule(config)` (no Pulumi, no client);
  used by `dbprovider render` and by the component.
- `infra.dashboard`: the Grafana dashboard (JSON, or a ConfigMap for the Grafana sidecar); used by
  `dbprovider render --only dashboard` and by the component.
- `infra.config`: the Pulumi stack config (`dbprovider:` keys), read once.
- `infra.component`: the `DbProvider` ComponentResource.
- `infra/__main__.py`: the Pulumi program (`Pulumi.yaml` `main: infra/`).
"""
