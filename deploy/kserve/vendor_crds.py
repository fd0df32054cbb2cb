"""Vendor KServe's CRD OpenAPI schemas: the openAPIV3Schema of each CRD this folder's manifests use, as gzipped JSON.

    python deploy/kserve/vendor_crds.py KSERVE_CHECKOUT [--tag v0.20.0]

reads config/crd/full/serving.kserve.io_{servingruntimes,inferenceservices}.yaml at the tag (git show) and writes
crd/<kind>.<version>.json.gz beside this file, with crd/VERSION naming the tag. tests/test_deploy.py validates the
manifests against them (docs/deploy.md)."""

import argparse
import gzip
import json
import subprocess
from pathlib import Path

import yaml

CRDS = ["servingruntimes", "inferenceservices"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkout", type=Path, help="a git checkout of kserve/kserve")
    parser.add_argument("--tag", default="v0.20.0")
    args = parser.parse_args()
    out = Path(__file__).parent / "crd"
    out.mkdir(exist_ok=True)
    for name in CRDS:
        text = subprocess.run(["git", "-C", str(args.checkout), "show",
                               f"{args.tag}:config/crd/full/serving.kserve.io_{name}.yaml"],
                              check=True, capture_output=True, text=True).stdout
        crd = yaml.safe_load(text)
        for version in crd["spec"]["versions"]:
            schema = {"group": crd["spec"]["group"], "kind": crd["spec"]["names"]["kind"], "version": version["name"],
                      "openAPIV3Schema": version["schema"]["openAPIV3Schema"]}
            path = out / f"{schema['kind']}.{schema['version']}.json.gz"
            path.write_bytes(gzip.compress(json.dumps(schema, sort_keys=True).encode(), mtime=0))
            print(path, path.stat().st_size)
    (out / "VERSION").write_text(f"kserve {args.tag} (config/crd/full)\n")


if __name__ == "__main__":
    main()
