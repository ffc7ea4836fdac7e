import pkgutil
from pathlib import Path

print("benchmarks (run one with: python -m bench.<name>):")
for mod in pkgutil.iter_modules([str(Path(__file__).parent)]):
    if not mod.name.startswith("_"):
        doc = (__import__(f"bench.{mod.name}", fromlist=["_"]).__doc__ or "").strip().splitlines()
        print(f"  {mod.name:22s} {doc[0] if doc else ''}")
