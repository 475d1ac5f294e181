#!/usr/bin/env bash
# Fetch the JVM artifacts of the tests' Iceberg REST catalog server from Maven Central, once, at install time:
#   <dest>/rest-catalog/ Apache Iceberg's REST catalog test server for the tests (jvm/rest-catalog/pom.xml)
# (Spark's Kafka connector and the demo's Kafka broker come through Spark's own spark.jars.packages and its
# Ivy cache, which `kappa jars` warms: airflow_provider_kappa/engine/jvm.py.)
# A folder may also hold *.java launchers: compiled (javac, against the fetched jars) into <dest>/<name>/kappa-<name>.jar.
# <dest>: $KAPPA_JVM_DIR, else .cache/jvm in this checkout (what airflow_provider_kappa/engine/jvm.py
# looks in). Each folder is replaced atomically and stamped with the hash of its pom (and launchers): a second
# run with the same files does nothing and contacts no registry. Maven keeps its own cache in ~/.m2.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dest="${KAPPA_JVM_DIR:-$here/../.cache/jvm}"
command -v java >/dev/null 2>&1 || { echo "Java 17 is missing: install it with 'apt-get install -y openjdk-17-jre-headless' and retry."; exit 1; }
mkdir -p "$dest"
dest="$(cd "$dest" && pwd)"
for name in rest-catalog; do
  pom="$here/$name/pom.xml"
  sources=("$here/$name"/*.java)
  [ -e "${sources[0]}" ] || sources=()
  stamp="$(cat "$pom" "${sources[@]}" | sha256sum | cut -c1-16)"
  if [ -f "$dest/$name/.stamp" ] && [ "$(cat "$dest/$name/.stamp")" = "$stamp" ]; then
    continue
  fi
  command -v mvn >/dev/null 2>&1 || { echo "Maven is missing (needed once to fetch the JVM artifacts): install it with 'apt-get install -y maven' and retry."; exit 1; }
  tmp="$dest/.$name.tmp.$$"
  log="$dest/$name.fetch.log"
  rm -rf "$tmp"
  if ! mvn -B -f "$pom" dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$tmp" >"$log" 2>&1; then
    rm -rf "$tmp"
    echo "Could not fetch the JVM artifacts of $pom from Maven Central (log: $log): check the network or the proxy/mirror in ~/.m2/settings.xml, then rerun 'make install' (or jvm/fetch.sh)."
    exit 1
  fi
  if [ "${#sources[@]}" -gt 0 ]; then
    command -v javac >/dev/null 2>&1 || { rm -rf "$tmp"; echo "javac is missing (needed once to build the launcher in jvm/$name): install it with 'apt-get install -y openjdk-17-jdk-headless' and retry."; exit 1; }
    if ! { javac -nowarn -cp "$tmp/*" -d "$tmp/.classes" "${sources[@]}" && jar cf "$tmp/kappa-$name.jar" -C "$tmp/.classes" .; } >"$log" 2>&1; then
      rm -rf "$tmp"
      echo "Could not compile ${sources[*]} against the fetched jars (log: $log)."
      exit 1
    fi
    rm -rf "$tmp/.classes"
  fi
  echo "$stamp" >"$tmp/.stamp"
  rm -rf "$dest/$name"
  mv "$tmp" "$dest/$name"
  rm -f "$log"
  echo "fetched $(ls "$dest/$name" | grep -c '\.jar$') jars into $dest/$name"
done
