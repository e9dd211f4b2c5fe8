# shardcached, the node daemon. Build: docker build -t shardcache:0.1.0 .   Run: see docs/deploy.md.
# Only the daemon extras are installed (no torch, no lance): the image holds the daemon and the small
# client CLI (`shardcache stats`), nothing a trainer needs.
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY daemon ./daemon
COPY client ./client
COPY protocol ./protocol
RUN python -m venv /opt/shardcache \
 && /opt/shardcache/bin/pip install ".[daemon]"

FROM python:3.11-slim
ARG UID=10001
ARG GID=10001
# The same uid/gid the Kubernetes manifests and the trainer containers' supplemental group use.
RUN groupadd --system --gid "${GID}" shardcache \
 && useradd --system --uid "${UID}" --gid shardcache --home-dir /var/cache/shardcache \
        --shell /usr/sbin/nologin shardcache \
 && install -d -o shardcache -g shardcache -m 0750 /run/shardcache /var/cache/shardcache
COPY --from=build /opt/shardcache /opt/shardcache
# The image's defaults are a config file at the lowest precedence, not SHARDCACHE_* variables: a variable
# would outrank the config file an operator mounts (a Kubernetes ConfigMap). Outside /etc/shardcache, where
# that file is mounted over the directory.
COPY deploy/docker/shardcached.defaults.toml /usr/share/shardcache/shardcached.defaults.toml
ENV PATH=/opt/shardcache/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER shardcache:shardcache
# The socket directory (share it with trainer containers) and the cache (put it on NVMe).
VOLUME ["/run/shardcache", "/var/cache/shardcache"]
# Metrics and health only; the client API is the Unix socket.
EXPOSE 9464
# slim has no curl: ask the health endpoint with the interpreter that is there anyway. The port is the
# defaults file's metrics_addr; change both together.
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:9464/v1/health', timeout=4).status == 200 else 1)"]
# Arguments after the image name (`docker run IMAGE --allow s3://b/p --config /etc/shardcache/x.toml`, a
# pod's args) come after the defaults file: flags win, and a later --config file overrides it.
ENTRYPOINT ["shardcached", "--config", "/usr/share/shardcache/shardcached.defaults.toml"]
CMD []
