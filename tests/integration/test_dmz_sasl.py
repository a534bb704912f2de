"""SASL for the DMZ: SCRAM-SHA-256 (RFC 5802/7677) and EXTERNAL (client certificates).

SCRAM is checked three ways: the RFC 7677 test vector against the mechanism;
``scramp`` (an independent SCRAM client) against a live node, including the
server signature the node returns in the outcome's additional-data; and the
refusals (wrong password, unknown user, tampered messages). proton-python here
has no Cyrus SASL (``proton.SASL.extended()`` is False) and rhea 3 has no
SCRAM client, so those two cannot speak SCRAM. EXTERNAL is checked with
proton-python presenting a client certificate.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ssl
import subprocess

import pytest
from conftest import PYTHON, ROOT, NodeProcess
from dmz_support import SASL_CHALLENGE, SASL_OUTCOME, RawClient, condition_of
from proton import Message, SSLDomain
from proton.utils import BlockingConnection

from proxy.auth.mechanisms import Authenticator, Challenge, SaslFailure, SaslSuccess, certificate_identity
from proxy.auth.scram import ScramSha256Mechanism
from proxy.auth.users import UserRecord, UsersFile, make_record

pytestmark = pytest.mark.dmz  # the DMZ gateway's tests: pytest -m dmz

AUTH = 1


# -- RFC 7677 section 3 test vector ------------------------------------------------
RFC_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
RFC_CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_FIRST = (b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                    b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
RFC_CLIENT_FINAL = (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
RFC_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def rfc_authenticator(tmp_path) -> Authenticator:
    """The user of RFC 7677 ("user"/"pencil"), with the verifiers RFC 5802 §3 defines."""
    salted = hashlib.pbkdf2_hmac("sha256", b"pencil", RFC_SALT, 4096)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    record = UserRecord("user", RFC_SALT, 4096, hashlib.sha256(client_key).digest(),
                        hmac.new(salted, b"Server Key", hashlib.sha256).digest(), ("ops",))
    return Authenticator(UsersFile(tmp_path / "u.json", {"user": record}))


def rfc_mechanism(tmp_path) -> ScramSha256Mechanism:
    return ScramSha256Mechanism(rfc_authenticator(tmp_path),
                                server_nonce=lambda: "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")


def test_rfc7677_vector(tmp_path):
    mech = rfc_mechanism(tmp_path)
    assert mech.start(RFC_CLIENT_FIRST) == Challenge(RFC_SERVER_FIRST)
    result = mech.respond(RFC_CLIENT_FINAL)
    assert result == SaslSuccess("user", "SCRAM-SHA-256", ("ops",), additional_data=RFC_SERVER_FINAL)


@pytest.mark.parametrize("client_final, reason", [
    (RFC_CLIENT_FINAL.replace(b"p=dHzb", b"p=AHzb"), "wrong password"),
    (RFC_CLIENT_FINAL.replace(b"hNlF$k0", b"hNlF$k1"), "nonce mismatch"),
    (RFC_CLIENT_FINAL.replace(b"c=biws", b"c=eSws"), "channel-binding"),
    (RFC_CLIENT_FINAL.replace(b",p=", b",x="), "malformed"),
    (b"c=biws,r=x,p=!!notbase64", "bad base64"),
    (b"\xff\xfe", "not UTF-8"),
])
def test_tampered_final_message_fails(tmp_path, client_final, reason):
    mech = rfc_mechanism(tmp_path)
    mech.start(RFC_CLIENT_FIRST)
    result = mech.respond(client_final)
    assert isinstance(result, SaslFailure) and result.code == AUTH
    assert reason in result.reason


@pytest.mark.parametrize("client_first, reason", [
    (b"p=tls-unique,,n=user,r=abc", "channel binding"),
    (b"n,a=admin,n=user,r=abc", "may not act as"),
    (b"n,,m=ext,n=user,r=abc", "mandatory extension"),
    (b"n,,r=abc,n=user", "needs n= then r="),
    (b"n,,n=us=ZZer,r=abc", "user name"),
    (b"n,,n=user,r=a,b", "malformed"),
    (b"garbage", "malformed"),
])
def test_malformed_first_message_fails(tmp_path, client_first, reason):
    result = rfc_mechanism(tmp_path).start(client_first)
    assert isinstance(result, SaslFailure) and reason in result.reason


def test_unknown_user_gets_a_plausible_challenge_then_fails(tmp_path):
    mech = ScramSha256Mechanism(rfc_authenticator(tmp_path))
    challenge = mech.start(b"n,,n=nobody,r=abcdef")
    assert isinstance(challenge, Challenge)
    fields = dict(part.split("=", 1) for part in challenge.data.decode().split(","))
    assert fields["r"].startswith("abcdef") and len(base64.b64decode(fields["s"])) == 16
    assert fields["i"] == "4096"
    again = ScramSha256Mechanism(mech.authenticator).start(b"n,,n=nobody,r=xyz")
    assert again.data.split(b",")[1] == challenge.data.split(b",")[1]  # same salt each time
    result = mech.respond(b"c=biws,r=" + fields["r"].encode() + b",p=" + base64.b64encode(b"x" * 32))
    assert isinstance(result, SaslFailure) and "unknown user" in result.reason


def test_certificate_identity_fields():
    cert = {"subject": ((("countryName", "DE"),), (("commonName", "alice"),),
                        (("emailAddress", "alice@example.org"),))}
    assert certificate_identity(cert) == "alice"
    assert certificate_identity(cert, "emailAddress") == "alice@example.org"
    assert certificate_identity(cert, "UID") is None
    assert certificate_identity({}) is None  # not verified: no identity


# -- against a live node -------------------------------------------------------------
@pytest.fixture(scope="module")
def scram_node(tmp_path_factory, certs):
    workdir = tmp_path_factory.mktemp("scram")
    users = workdir / "users.json"
    for name, password, groups in (("bob", "correct horse", "ops"), ("alice", "alice pw", "")):
        subprocess.run([PYTHON, "-m", "proxy", "users", "add", name, "--file", str(users),
                        "--password-stdin", "--groups", groups],
                       input=password.encode() + b"\n", check=True, cwd=ROOT, capture_output=True)
    node = NodeProcess(workdir, {
        "tls": {"cert": str(certs.server_cert), "key": str(certs.server_key), "ca": str(certs.ca)},
        "sasl": {"mechanisms": ["SCRAM-SHA-256", "EXTERNAL", "PLAIN"], "users_file": str(users)},
        "limits": {"handshake_timeout": 2.0},
    }).start()
    yield node
    node.stop()


def tls_context(certs, with_cert: bool = False) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs.ca))
    if with_cert:
        context.load_cert_chain(str(certs.client_cert), str(certs.client_key))
    return context


def test_scramp_client_authenticates_and_verifies_the_server(scram_node, certs):
    client = RawClient("127.0.0.1", scram_node.port, context=tls_context(certs))
    try:
        offered = client.start_sasl()
        assert "SCRAM-SHA-256" in offered and "EXTERNAL" not in offered  # no client certificate
        code, server_final = client.scram("bob", "correct horse")  # scramp checks v=
        assert code == 0 and server_final.startswith(b"v=")
        assert client.amqp().send("bob.jobs", "hello") == "accepted"
    finally:
        client.close()
    assert "authenticated: user bob (SCRAM-SHA-256)" in scram_node.log_path.read_text()


@pytest.mark.parametrize("user, password", [("bob", "wrong horse"), ("nobody", "x")])
def test_scram_refuses_wrong_password_and_unknown_user(scram_node, certs, user, password):
    client = RawClient("127.0.0.1", scram_node.port, context=tls_context(certs))
    try:
        client.start_sasl()
        code, additional = client.scram(user, password)
        assert (code, additional) == (AUTH, None)
        assert client.read_until_closed(5) == b""
    finally:
        client.close()


def test_scram_replayed_final_message_fails(scram_node, certs):
    """A captured client-final message is useless on a new exchange (fresh server nonce)."""
    from scramp import ScramClient

    first = RawClient("127.0.0.1", scram_node.port, context=tls_context(certs))
    scram = ScramClient(["SCRAM-SHA-256"], "bob", "correct horse", c_nonce="fixedclientnonce")
    first.start_sasl()
    code, fields = first.init("SCRAM-SHA-256", scram.get_client_first().encode())
    assert code == SASL_CHALLENGE
    scram.set_server_first(fields[0].decode())
    captured = scram.get_client_final().encode()
    first.close()
    second = RawClient("127.0.0.1", scram_node.port, context=tls_context(certs))
    try:
        second.start_sasl()
        again = ScramClient(["SCRAM-SHA-256"], "bob", "correct horse", c_nonce="fixedclientnonce")
        code, _ = second.init("SCRAM-SHA-256", again.get_client_first().encode())
        assert code == SASL_CHALLENGE
        assert second.respond(captured) == (SASL_OUTCOME, [AUTH])
    finally:
        second.close()


def proton_tls(certs, with_cert: bool) -> SSLDomain:
    domain = SSLDomain(SSLDomain.MODE_CLIENT)
    domain.set_trusted_ca_db(str(certs.ca))
    domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME)
    if with_cert:
        domain.set_credentials(str(certs.client_cert), str(certs.client_key), None)
    return domain


def test_external_takes_the_identity_from_the_client_certificate(scram_node, certs):
    url = f"amqps://localhost:{scram_node.port}"
    conn = BlockingConnection(url, ssl_domain=proton_tls(certs, True), allowed_mechs="EXTERNAL",
                              timeout=10)
    try:
        conn.create_sender("alice.inbox").send(Message(body="via certificate"))
    finally:
        conn.close()
    assert "authenticated: user alice (EXTERNAL)" in scram_node.log_path.read_text()


def test_external_is_not_offered_without_a_client_certificate(scram_node, certs):
    with pytest.raises(Exception) as info:
        BlockingConnection(f"amqps://localhost:{scram_node.port}", ssl_domain=proton_tls(certs, False),
                           allowed_mechs="EXTERNAL", timeout=10)
    assert condition_of(info.value) == "amqp:unauthorized-access"
    client = RawClient("127.0.0.1", scram_node.port, context=tls_context(certs))
    try:
        client.start_sasl()
        assert client.init("EXTERNAL", b"") == (SASL_OUTCOME, [AUTH])  # not offered: refused
    finally:
        client.close()


def test_external_authzid_must_match_the_certificate(scram_node, certs):
    client = RawClient("127.0.0.1", scram_node.port, context=tls_context(certs, with_cert=True))
    try:
        assert "EXTERNAL" in client.start_sasl()
        assert client.init("EXTERNAL", b"bob") == (SASL_OUTCOME, [AUTH])
    finally:
        client.close()


def test_users_file_refuses_the_reserved_anonymous_name(tmp_path):
    from proxy.auth.users import UsersFileError

    with pytest.raises(UsersFileError):
        make_record("anonymous", "pw")


@pytest.mark.parametrize("raw, key", [
    ({"sasl": {"mechanisms": ["SCRAM-SHA-256"]}}, "sasl.users_file"),
    ({"sasl": {"mechanisms": ["EXTERNAL"]}}, "sasl.mechanisms"),               # needs [tls] with a ca
    ({"sasl": {"mechanisms": ["EXTERNAL"]}, "tls": {"cert": "c", "key": "k"}}, "sasl.mechanisms"),
    ({"sasl": {"external_identity": "shoe size"}}, "sasl.external_identity"),
    ({"limits": {"max_connections_per_ip": -1}}, "limits.max_connections_per_ip"),
    ({"limits": {"max_connections_per_user": "ten"}}, "limits.max_connections_per_user"),
])
def test_dmz_config_errors_name_the_key(raw, key):
    from proxy.config import settings as config_mod
    from proxy.config.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        config_mod.from_dict(raw)
    assert info.value.key == key


def test_external_with_a_ca_makes_client_certificates_optional_but_verified(certs):
    from proxy.config import settings as config_mod
    from proxy.node import build_tls_context

    tls = {"cert": str(certs.server_cert), "key": str(certs.server_key), "ca": str(certs.ca)}
    optional = build_tls_context(config_mod.from_dict(
        {"tls": tls, "sasl": {"mechanisms": ["EXTERNAL", "ANONYMOUS"]}}))
    assert optional.verify_mode == ssl.CERT_OPTIONAL
    required = build_tls_context(config_mod.from_dict({"tls": {**tls, "verify_client": True}}))
    assert required.verify_mode == ssl.CERT_REQUIRED
