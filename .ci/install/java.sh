#!/usr/bin/env bash
# A Java runtime for PySpark (the Spark load generator, spark_load/, and its
# tests). Spark 4 needs Java 17 or 21. Idempotent: a no-op when a suitable
# `java` is on PATH.
set -euo pipefail
java_major() { java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1; }
if command -v java >/dev/null && [ "$(java_major)" -ge 17 ] 2>/dev/null; then
  echo "java.sh: java $(java_major) is installed"
  exit 0
fi
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo -n "$@"; fi; }
echo "java.sh: installing Debian's openjdk-17-jre-headless"
export DEBIAN_FRONTEND=noninteractive
if ! as_root apt-get install -y openjdk-17-jre-headless >/tmp/java-apt.log 2>&1; then
  as_root apt-get update -qq
  as_root apt-get install -y openjdk-17-jre-headless >/tmp/java-apt.log 2>&1 \
    || { tail -20 /tmp/java-apt.log >&2; echo "java.sh: apt-get install openjdk-17-jre-headless failed" >&2; exit 1; }
fi
echo "java.sh: installed java $(java_major)"
