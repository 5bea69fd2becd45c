"""Print the versions of the packages a device run depends on, one line, for the head of the run's log.

    PYTHONPATH=src python benchmarks/versions.py [PACKAGE ...]     # default: torch transformers triton
"""

from __future__ import annotations

import sys

from ddtree.pipeline.envinfo import package_versions

DEFAULT_PACKAGES = ("torch", "transformers", "triton")


def main(argv: list[str]) -> None:
    versions = package_versions(argv or DEFAULT_PACKAGES)
    print(" ".join(f"{name} {version or 'absent'}" for name, version in versions.items()))


if __name__ == "__main__":
    main(sys.argv[1:])
