#!/usr/bin/env bash
# Installs what the tests need on a fresh machine (Rust is assumed):
# ab (apache2-utils) and python3 for the article's check; the real servers
# that tests/health_protocols.rs checks (redis-server, nginx and openssl,
# MariaDB, PostgreSQL); HAProxy, in front of rodizio in tests/proxy_protocol.rs;
# headless Chromium and the Python prometheus_client for
# scripts/observability-check.sh; systemd-analyze for scripts/unit-check.sh.
set -euo pipefail

# A program's path, also where Debian keeps it out of PATH.
has() {
  command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] ||
    compgen -G "/usr/lib/postgresql/*/bin/$1" >/dev/null
}

need=()
has ab || need+=(apache2-utils)
has python3 || need+=(python3)
has curl || need+=(curl)
has redis-server || need+=(redis-server)
has redis-benchmark || need+=(redis-tools) # tests/services.rs
has redis-cli || need+=(redis-tools) # tests/tls.rs (redis-cli --tls)
has haproxy || need+=(haproxy)
has nginx || need+=(nginx)
has openssl || need+=(openssl)
{ has mariadbd && has mariadb-install-db; } || need+=(mariadb-server)
{ has postgres && has initdb; } || need+=(postgresql)
has chromium || need+=(chromium)
has prometheus || need+=(prometheus) # the server that scrapes rodizio in scripts/observability-check.sh
has systemd-analyze || need+=(systemd) # scripts/unit-check.sh verifies contrib/rodizio.service
has rsyslogd || need+=(rsyslog) # tests/access_log_syslog.rs: the access log's syslog target
# tests/resolve.rs runs rodizio in a private mount namespace over its own
# /etc/hosts: unshare and mount, both util-linux (mount its own package).
has unshare || need+=(util-linux)
has mount || need+=(mount)
has dnsmasq || need+=(dnsmasq-base) # tests/srv.rs: the nameserver of srv: backends
has etcd || need+=(etcd-server)     # tests/etcd.rs: the store of backends_from
has etcdctl || need+=(etcd-client)  # tests/etcd.rs: keys put and deleted
has pip3 || python3 -m pip --version >/dev/null 2>&1 || need+=(python3-pip)

if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  # The packages' own services are not used: the tests start their own
  # servers, as children, on free ports.
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi
# The Prometheus project's Python parser, for scripts/observability-check.sh.
if ! python3 -c 'import prometheus_client' 2>/dev/null; then
  echo "installing: prometheus_client (pip)"
  python3 -m pip install -q prometheus_client 2>/dev/null ||
    python3 -m pip install -q --break-system-packages prometheus_client
fi
rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy rustfmt >/dev/null 2>&1 || true
