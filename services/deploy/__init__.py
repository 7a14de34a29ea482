"""What installs and deploys a plane, outside any running node.

* ``compose_secrets``, ``compose_bundles``, ``compose_databases``: the docker compose stack's
  one-shot services (``python -m services.deploy.compose_secrets`` and
  ``python -m services.deploy.compose_databases``; ``docker-compose.yml``);
* ``db_roles``: each node's least-privilege database role;
* ``installation``: whether the imported packages are the convplane distribution's own;
* ``config_reference``: ``docs/configuration.md``, generated from the settings models.

Imports the node-wide basics (``services.config``, ``services.cluster_tls``) only.
"""
