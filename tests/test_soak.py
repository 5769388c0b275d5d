"""Short CI version of tests/soak.py: 4 threads × 1,500 mixed calls each through the resolver
while the configuration is rewritten and reloaded underneath them (the full run —
``python tests/soak.py``, 4 × 100,000 calls — is by hand; see CONTRIBUTING.md)."""
from __future__ import annotations

from tests import soak


def test_soak_short(isolated_config):
    s = soak.run(threads=4, calls=1500, config_path=isolated_config, check_every=10, reload_every_s=0.002)
    assert not s["errors"], s["errors"]
    assert not s["wrong_results"], s["wrong_results"]
    assert not s["fallback_warnings"], s["fallback_warnings"]
    assert s["calls"] == 6000 and s["checked"] >= 500 and s["reloads"] >= 1, s
    assert s["rss_growth_mb"] < 20, s
    assert s["ok"], s
