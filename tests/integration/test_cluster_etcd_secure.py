"""A cluster on an etcd that takes clients over TLS with client certificates, with etcd's
authentication on ([cluster] ca, cert, key, user, password_file; docs/cluster.md)."""

from __future__ import annotations

import subprocess

from admin_client import http
from cluster_support import coordinator, etcd_node, wait_members
from conftest import PYTHON, ROOT, to_toml
from etcd_servers import cluster_name, etcd_members  # noqa: F401 (fixtures)


def test_tls_with_client_certificates_and_etcd_authentication(start_node, etcd_members, certs,
                                                              cluster_name, tmp_path):
    etcd = etcd_members.member("secure", tls=certs)
    etcd.ctl("user", "add", "root:root-password")
    etcd.ctl("user", "add", "fedgate:a-long-etcd-password")
    etcd.ctl("role", "add", "fedgate")
    etcd.ctl("role", "grant-permission", "fedgate", "--prefix=true", "readwrite", "/fedgate/")
    etcd.ctl("user", "grant-role", "fedgate", "fedgate")
    etcd.ctl("auth", "enable")
    password = tmp_path / "etcd-password"
    password.write_text("a-long-etcd-password\n")
    secure = {"ca": str(certs.ca), "cert": str(certs.client_cert), "key": str(certs.client_key),
              "user": "fedgate", "password_file": str(password)}
    n1 = etcd_node(start_node, "n1", [etcd.url], cluster_name, cluster=secure)
    n2 = etcd_node(start_node, "n2", [etcd.url], cluster_name, cluster=secure)
    wait_members(n1, ["n1", "n2"], 2.0)
    view = coordinator(n1)
    assert view["healthy"] and view["acting"] and view["endpoint"].startswith("https://")
    status, body = http("POST", n1.admin_url + "/api/v1/rules",
                        {"name": "x", "match": "x.*", "kind": "deny"})
    assert status == 201, body

    # a wrong password: the node does not start, and says why
    wrong = tmp_path / "wrong-password"
    wrong.write_text("not-it\n")
    config = tmp_path / "n3.toml"
    config.write_text(to_toml({
        "node": {"id": "n3", "listen": "127.0.0.1:1", "data_dir": str(tmp_path / "n3")},
        "admin": {"enabled": False},
        "cluster": {"name": cluster_name, "etcd": [etcd.url], "start_timeout": 3.0,
                    **dict(secure, password_file=str(wrong))}}))
    proc = subprocess.run([PYTHON, "-m", "proxy", "serve", "--config", str(config)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "did not answer within 3s" in proc.stderr and "authentication failed" in proc.stderr, \
        proc.stderr[-1500:]
