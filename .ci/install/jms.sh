#!/usr/bin/env bash
# Build the Qpid JMS test client (tests/jms: qpid-jms-client from Maven Central)
# used by tests/interop/test_jms.py: classes in tests/jms/target/classes, jars in
# tests/jms/target/lib. Needs a JDK (javac) and Maven: Debian's
# openjdk-17-jdk-headless and maven are installed when missing. Idempotent:
# nothing is rebuilt while the classes are newer than the sources and the pom.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DIR="$ROOT/tests/jms"
CLASS="$DIR/target/classes/fedgate/JmsClient.class"
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo -n "$@"; fi; }

if [ -f "$CLASS" ] && [ -d "$DIR/target/lib" ] \
   && [ -z "$(find "$DIR/pom.xml" "$DIR/src" -newer "$CLASS" -type f)" ]; then
  echo "jms.sh: the Qpid JMS test client is built"
  exit 0
fi
missing=()
command -v javac >/dev/null || missing+=(openjdk-17-jdk-headless)
command -v mvn >/dev/null || missing+=(maven)
if [ ${#missing[@]} -gt 0 ]; then
  echo "jms.sh: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  if ! as_root apt-get install -y "${missing[@]}" >/tmp/jms-apt.log 2>&1; then
    as_root apt-get update -qq
    as_root apt-get install -y "${missing[@]}" >/tmp/jms-apt.log 2>&1 \
      || { tail -20 /tmp/jms-apt.log >&2; echo "jms.sh: apt-get install failed" >&2; exit 1; }
  fi
fi
echo "jms.sh: building the Qpid JMS test client"
mvn -q -B -Dstyle.color=never -f "$DIR/pom.xml" package 2>&1 | sed "s/\x1b\[[0-9;]*m//g"
test -f "$CLASS" || { echo "jms.sh: build produced no $CLASS" >&2; exit 1; }
echo "jms.sh: built"
