"""Everything in deploy/ is checked: configs validate, manifests and units say what they must.

* every ``deploy/**/*.toml`` passes ``fedgate check-config --no-files`` (the
  files they name live on the target machine), and ``dmz.toml`` passes the
  full check once its file paths point at generated certificates and a users file;
* the Kubernetes manifests parse (PyYAML) and wire ports, probes and the
  ConfigMap together; the ConfigMap's TOML passes check-config;
* the systemd unit carries the hardening options; the Containerfile's
  instructions are well formed (no container engine here to build it).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tomllib

import pytest
import yaml
from conftest import PYTHON, ROOT, require, to_toml

pytestmark = pytest.mark.dmz  # the DMZ gateway's tests: pytest -m dmz

DEPLOY = ROOT / "deploy"
TOML_FILES = sorted(DEPLOY.rglob("*.toml"))


def fedgate(*args, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "proxy", *args], input=stdin, capture_output=True,
                          cwd=ROOT, timeout=60)


def test_the_expected_files_exist():
    names = {p.relative_to(DEPLOY).as_posix() for p in DEPLOY.rglob("*") if p.is_file()}
    assert {"concentrator.toml", "dmz.toml", "cluster/n1.toml", "cluster/n2.toml", "cluster/n3.toml",
            "systemd/fedgate.service", "Containerfile", "kubernetes/fedgate.yaml"} <= names


@pytest.mark.parametrize("path", TOML_FILES, ids=lambda p: p.relative_to(DEPLOY).as_posix())
def test_every_toml_passes_check_config(path):
    result = fedgate("check-config", "--no-files", str(path))
    assert result.returncode == 0, result.stderr.decode()
    assert b": ok" in result.stdout


def test_check_config_names_a_missing_file_unless_told_not_to():
    result = fedgate("check-config", str(DEPLOY / "dmz.toml"))
    assert result.returncode == 2
    assert b"not found" in result.stderr and b"--no-files" in result.stderr


def test_dmz_config_passes_the_full_check_with_real_files(tmp_path):
    require(shutil.which("openssl") is not None, "openssl")
    from certs import make_certs

    certs = make_certs(tmp_path / "certs")
    users = tmp_path / "users.json"
    assert fedgate("users", "add", "partner-a", "--file", str(users), "--password-stdin",
                   "--groups", "partners", stdin=b"a long passphrase\n").returncode == 0
    raw = tomllib.loads((DEPLOY / "dmz.toml").read_text())
    raw["tls"].update(cert=str(certs.server_cert), key=str(certs.server_key), ca=str(certs.ca))
    raw["sasl"]["users_file"] = str(users)
    path = tmp_path / "dmz.toml"
    path.write_text(to_toml(raw))
    result = fedgate("check-config", str(path))
    assert result.returncode == 0, result.stderr.decode()


def test_dmz_config_is_locked_down():
    raw = tomllib.loads((DEPLOY / "dmz.toml").read_text())
    assert raw["tls"]["cert"] and raw["tls"]["key"]
    assert "ANONYMOUS" not in raw["sasl"]["mechanisms"] and raw["sasl"]["require"] is True
    assert {"PLAIN", "SCRAM-SHA-256"} <= set(raw["sasl"]["mechanisms"])
    assert raw["acl"], "ACL entries make everything else denied"
    assert raw["admin"]["listen"].startswith("127.0.0.1:")
    assert raw["queues"]["auto_create"] is False
    limits = raw["limits"]
    for key in ("max_connections", "max_connections_per_ip", "max_connections_per_user",
                "max_message_size", "handshake_timeout", "idle_timeout"):
        assert limits[key] > 0, key


def test_concentrator_proxies_to_one_primary():
    raw = tomllib.loads((DEPLOY / "concentrator.toml").read_text())
    proxies = [r for r in raw["rules"] if r["kind"] == "proxy"]
    assert len({r["primary"] for r in proxies}) == 1 and proxies[-1]["match"] == "#"


def test_cluster_nodes_know_each_other_and_share_the_fragmented_rule():
    nodes = {p.stem: tomllib.loads(p.read_text()) for p in sorted((DEPLOY / "cluster").glob("*.toml"))}
    assert set(nodes) == {"n1", "n2", "n3"}
    for name, raw in nodes.items():
        assert raw["node"]["id"] == name
        assert set(raw["peers"]) == set(nodes) - {name}
        (rule,) = [r for r in raw["rules"] if r["kind"] == "fragmented"]
        assert rule["fragments"] == ["n1", "n2", "n3"]
    assert len({json.dumps(raw["rules"], sort_keys=True) for raw in nodes.values()}) == 1


# -- Kubernetes ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def manifests():
    docs = [d for d in yaml.safe_load_all((DEPLOY / "kubernetes" / "fedgate.yaml").read_text()) if d]
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def test_kubernetes_statefulset_probes_ports_and_security(manifests):
    sts = manifests[("StatefulSet", "fedgate")]
    pod = sts["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"amqp": 5672, "admin": 8080}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert sts["spec"]["selector"]["matchLabels"].items() <= labels.items()
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["config"]["configMap"]["name"] == "fedgate-config"
    config_path = container["args"][container["args"].index("--config") + 1]
    assert config_path.startswith(mounts["config"] + "/")
    assert "data" in mounts and sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"


def test_kubernetes_services_select_the_pods(manifests):
    labels = manifests[("StatefulSet", "fedgate")]["spec"]["template"]["metadata"]["labels"]
    for name, port in (("fedgate", "amqp"), ("fedgate-admin", "admin")):
        service = manifests[("Service", name)]
        assert service["spec"]["selector"].items() <= labels.items()
        assert [p["targetPort"] for p in service["spec"]["ports"]] == [port]


def test_kubernetes_configmap_holds_a_valid_config_that_matches_the_pod(manifests, tmp_path):
    text = manifests[("ConfigMap", "fedgate-config")]["data"]["fedgate.toml"]
    path = tmp_path / "fedgate.toml"
    path.write_text(text)
    result = fedgate("check-config", "--no-files", str(path))
    assert result.returncode == 0, result.stderr.decode()
    raw = tomllib.loads(text)
    assert raw["rules"], "the ConfigMap carries the routing rules"
    assert raw["node"]["listen"] == "0.0.0.0:5672" and raw["admin"]["listen"] == "0.0.0.0:8080"
    assert raw["node"]["data_dir"] == "/var/lib/fedgate"


# -- systemd and the container file -------------------------------------------------------
def unit_settings(text: str) -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    section = ""
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        settings.setdefault(f"{section}.{key.strip()}", []).append(value.strip())
    return settings


def test_systemd_unit_is_hardened():
    settings = unit_settings((DEPLOY / "systemd" / "fedgate.service").read_text())
    expected = {
        "Service.DynamicUser": "yes", "Service.NoNewPrivileges": "yes", "Service.ProtectSystem": "strict",
        "Service.ProtectHome": "yes", "Service.PrivateTmp": "yes", "Service.PrivateDevices": "yes",
        "Service.StateDirectory": "fedgate", "Service.CapabilityBoundingSet": "",
        "Service.RestrictSUIDSGID": "yes", "Service.KillSignal": "SIGTERM",
    }
    for key, value in expected.items():
        assert settings.get(key) == [value], key
    assert "AF_INET" in settings["Service.RestrictAddressFamilies"][0]
    assert settings["Service.ExecStart"][0].split()[1:3] == ["serve", "--config"]
    assert settings["Install.WantedBy"] == ["multi-user.target"]


def test_systemd_unit_verifies(tmp_path):
    """systemd's own parser accepts the unit (with the fedgate path pointed at this venv)."""
    analyze = shutil.which("systemd-analyze")
    require(analyze is not None, "systemd-analyze (package systemd)")
    unit = (DEPLOY / "systemd" / "fedgate.service").read_text()
    venv_fedgate = str(ROOT / ".venv" / "bin" / "fedgate")
    path = tmp_path / "fedgate.service"
    path.write_text(unit.replace("/opt/fedgate/bin/fedgate", venv_fedgate))
    result = subprocess.run([analyze, "verify", "--man=no", str(path)], capture_output=True, timeout=60)
    problems = [line for line in result.stderr.decode().splitlines() if "fedgate.service" in line]
    assert result.returncode == 0 and not problems, result.stderr.decode()


def containerfile_instructions(text: str) -> list[tuple[str, str]]:
    joined = text.replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_containerfile_is_well_formed():
    instructions = containerfile_instructions((DEPLOY / "Containerfile").read_text())
    known = {"FROM", "RUN", "COPY", "WORKDIR", "ENV", "USER", "VOLUME", "EXPOSE", "HEALTHCHECK",
             "STOPSIGNAL", "ENTRYPOINT", "CMD"}
    assert instructions[0][0] == "FROM" and all(word in known for word, _ in instructions)
    final = instructions[max(i for i, (w, _) in enumerate(instructions) if w == "FROM"):]
    users = [arg for word, arg in final if word == "USER"]
    assert users and users[-1] not in ("root", "0")
    for word, arg in instructions:
        if word == "COPY" and not arg.startswith("--from"):
            *sources, _ = arg.split()
            for source in sources:
                assert (ROOT / source).exists(), f"COPY source {source} missing"
        if word in ("ENTRYPOINT", "CMD"):
            assert isinstance(json.loads(arg), list)  # exec form: signals reach fedgate
    entry = json.loads(dict(final)["ENTRYPOINT"]) + json.loads(dict(final)["CMD"])
    assert entry[:2] == ["fedgate", "serve"]
    assert "5672" in dict(final)["EXPOSE"].split()
    assert "/healthz" in dict(final)["HEALTHCHECK"]


def test_check_config_runs_on_the_example_the_image_ships(tmp_path):
    """The image rewrites standalone.toml to listen on 0.0.0.0; that must still validate."""
    text = (DEPLOY / "examples" / "standalone.toml").read_text()
    text = text.replace('listen = "127.0.0.1:', 'listen = "0.0.0.0:')
    path = tmp_path / "image.toml"
    path.write_text(text)
    assert fedgate("check-config", str(path)).returncode == 0
