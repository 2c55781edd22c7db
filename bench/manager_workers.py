"""`dbprovider manager` with another number of Database controller workers: an experiment only.

    python -m bench.manager_workers WORKERS manager --config ... (the arguments of `dbprovider manager`)

The product has no such option (`reconciler.setup.DATABASE_WORKERS` is 4); the provisioning
benchmark uses this wrapper (`--database-workers N`) to test whether more workers close the gap
to the SQL baseline before anyone proposes changing the product.
"""

from __future__ import annotations

import sys

import reconciler.setup


def main() -> int:
    reconciler.setup.DATABASE_WORKERS = int(sys.argv[1])
    from dbprovider.cli import main as cli_main

    return cli_main(sys.argv[2:])


if __name__ == "__main__":
    raise SystemExit(main())
