"""The [oauth] table (proxy.auth.oauth.settings, registered in proxy.config.settings)."""

from __future__ import annotations

import pytest
from oauth_issuer import AUDIENCE, ISSUER, Issuer, public_pem

from proxy.auth.oauth import KeySet
from proxy.config.errors import ConfigError
from proxy.config.settings import from_dict


def test_config_table(tmp_path):
    pem = tmp_path / "k1.pem"
    pem.write_bytes(public_pem(Issuer().keys["rsa-1"][1]))
    base = {"issuer": ISSUER, "audience": AUDIENCE}
    config = from_dict({"oauth": {**base, "keys": [str(pem)], "map": [
        {"claim": "groups", "value": "ops", "send": ["a.#"], "admin": True}]},
        "sasl": {"mechanisms": ["OAUTHBEARER", "PLAIN"]}})
    assert config.oauth.scope_prefix == "fedgate." and config.oauth.scope_claim == "scope"
    keys = KeySet.from_config(config.oauth, config.resolve_path)
    assert list(keys.static) == ["k1"]
    for bad, key in [({**base}, "oauth.jwks_url"), ({"audience": "a", "keys": ["x"]}, "oauth.issuer"),
                     ({**base, "keys": ["x"], "map": [{"claim": "g", "value": "v", "send": [""]}]},
                      "oauth.map[0].send[0]"),
                     ({**base, "keys": ["x"], "map": [{"claim": "g", "value": "v", "sudo": True}]},
                      "oauth.map[0].sudo")]:
        with pytest.raises(ConfigError) as exc:
            from_dict({"oauth": bad})
        assert exc.value.key == key
    with pytest.raises(ConfigError, match="OAUTHBEARER needs"):
        from_dict({"sasl": {"mechanisms": ["OAUTHBEARER"]}})


def test_plain_needs_a_users_file_or_oauth():
    with pytest.raises(ConfigError, match="PLAIN needs a users file"):
        from_dict({"sasl": {"mechanisms": ["PLAIN"]}})
    from_dict({"sasl": {"mechanisms": ["PLAIN"]},
               "oauth": {"issuer": ISSUER, "audience": AUDIENCE, "jwks_url": "http://127.0.0.1:1/certs"}})


def test_check_config_loads_the_key_files(tmp_path):
    import subprocess

    from conftest import PYTHON, ROOT

    pem = tmp_path / "idp.pem"
    pem.write_bytes(public_pem(Issuer().keys["rsa-1"][1]))
    config = tmp_path / "n.toml"
    body = (f'[sasl]\nmechanisms = ["PLAIN"]\n[oauth]\nissuer = "{ISSUER}"\naudience = "{AUDIENCE}"\n'
            'keys = ["idp.pem"]\n')
    config.write_text(body)
    ok = subprocess.run([PYTHON, "-m", "proxy", "check-config", str(config)], cwd=ROOT,
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    config.write_text(body.replace("idp.pem", "gone.pem"))
    bad = subprocess.run([PYTHON, "-m", "proxy", "check-config", str(config)], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "config error: oauth.keys[0]:" in bad.stderr
