"""The cluster-on-etcd deploy examples say what they must: three nodes with their own ids
and advertised URLs, every node pointed at every etcd member, configs that validate
(compose: ``deploy/cluster-etcd/``; Kubernetes: ``deploy/kubernetes/fedgate-etcd.yaml``)."""

from __future__ import annotations

import subprocess
import tomllib

import yaml
from conftest import PYTHON, ROOT

DEPLOY = ROOT / "deploy"


def check_config(path) -> None:
    result = subprocess.run([PYTHON, "-m", "proxy", "check-config", "--no-files", str(path)],
                            capture_output=True, cwd=ROOT, timeout=60)
    assert result.returncode == 0, result.stderr.decode()


def flag(args: list[str], name: str) -> str:
    for index, arg in enumerate(args):
        if arg == name:
            return args[index + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    raise AssertionError(f"{name} not in {args}")


def test_compose_three_nodes_on_a_three_member_etcd():
    compose = yaml.safe_load((DEPLOY / "cluster-etcd" / "compose.yaml").read_text())
    services = compose["services"]
    etcd = sorted(name for name in services if name.startswith("etcd"))
    nodes = sorted(name for name in services if name.startswith("n"))
    assert etcd == ["etcd1", "etcd2", "etcd3"] and nodes == ["n1", "n2", "n3"]
    config = tomllib.loads((DEPLOY / "cluster-etcd" / "fedgate.toml").read_text())
    assert config["cluster"]["etcd"] == [f"http://{name}:2379" for name in etcd]
    assert config["rules"][0]["fragments"] == "*" and "peers" not in config
    for name in nodes:
        args = services[name]["command"]
        assert flag(args, "--node-id") == name
        assert flag(args, "--advertise") == f"amqp://{name}:5672"
        assert flag(args, "--advertise-admin") == f"http://{name}:8080"
        assert set(services[name]["depends_on"]) == set(etcd)
    check_config(DEPLOY / "cluster-etcd" / "fedgate.toml")


def test_kubernetes_fedgate_pods_register_as_their_pod_names_in_a_three_member_etcd(tmp_path):
    docs = [d for d in yaml.safe_load_all((DEPLOY / "kubernetes" / "fedgate-etcd.yaml").read_text()) if d]
    found = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    etcd = found[("StatefulSet", "etcd")]
    assert etcd["spec"]["replicas"] == 3 and found[("Service", "etcd")]["spec"]["clusterIP"] == "None"
    fedgate = found[("StatefulSet", "fedgate")]
    (container,) = fedgate["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert flag(args, "--node-id") == "$(POD_NAME)"
    assert flag(args, "--advertise").startswith("amqp://$(POD_NAME).fedgate-nodes.")
    assert fedgate["spec"]["serviceName"] == "fedgate-nodes"
    text = found[("ConfigMap", "fedgate-cluster-config")]["data"]["fedgate.toml"]
    config = tomllib.loads(text)
    assert config["cluster"]["etcd"] == [f"http://etcd-{k}.etcd:2379" for k in range(3)]
    path = tmp_path / "fedgate.toml"
    path.write_text(text)
    check_config(path)
