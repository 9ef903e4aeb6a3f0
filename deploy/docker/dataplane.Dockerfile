# luftpause/dataplane: `luftpause-dataplane` (the luftpause-dataplane distribution), the
# OpenAI-compatible proxy on :8080. It finds its scheduler at LUFTPAUSE_SCHEDULER (the service
# name `scheduler` by default).
ARG BASE_IMAGE=python:3.11-slim

# ---- shared by every luftpause image: the base with the extra CA certificates and the user.
FROM ${BASE_IMAGE} AS base
# Extra CA certificates (*.crt in this directory of the build context): a registry or package
# index behind an intercepting proxy, a private engine URL. They join the system bundle, which
# pip and the services trust.
ARG CA_CERTS=deploy/docker/ca
COPY ${CA_CERTS}/ /tmp/ca/
RUN find /tmp/ca -name '*.crt' -exec cp {} /usr/local/share/ca-certificates/ \; \
    && update-ca-certificates \
    && rm -rf /tmp/ca \
    && groupadd --gid 10001 luftpause \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin luftpause
ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

# ---- the venv: only this image's distributions. Each one's third-party dependencies first, in a
# layer of its own (as its pyproject.toml names them; they change less often than the code), in
# the order every image installs them (common, rpc, then the service's own), so an image reuses
# the layers it shares with one built before it. Then the wheels of these distributions only,
# from dist/ (`make wheel`; without them COPY fails, "no source files"), so a change to another
# distribution leaves this image cached; pip itself is not kept. `python3` is the base image's.
FROM base AS venv
COPY deploy/docker/requirements.py /tmp/build/
RUN python3 -m venv /opt/luftpause
COPY services/common/pyproject.toml /tmp/build/common/
RUN python3 /tmp/build/requirements.py /tmp/build/common/pyproject.toml > /tmp/build/common.txt \
    && /opt/luftpause/bin/pip install --no-cache-dir -r /tmp/build/common.txt
COPY proto/pyproject.toml /tmp/build/rpc/
RUN python3 /tmp/build/requirements.py /tmp/build/rpc/pyproject.toml > /tmp/build/rpc.txt \
    && /opt/luftpause/bin/pip install --no-cache-dir -r /tmp/build/rpc.txt
COPY services/dataplane/pyproject.toml /tmp/build/dataplane/
RUN python3 /tmp/build/requirements.py /tmp/build/dataplane/pyproject.toml > /tmp/build/dataplane.txt \
    && /opt/luftpause/bin/pip install --no-cache-dir -r /tmp/build/dataplane.txt
COPY dist/luftpause_common-*.whl dist/luftpause_rpc-*.whl dist/luftpause_dataplane-*.whl /tmp/dist/
RUN /opt/luftpause/bin/pip install --no-cache-dir --no-deps /tmp/dist/luftpause_common-*.whl /tmp/dist/luftpause_rpc-*.whl /tmp/dist/luftpause_dataplane-*.whl \
    && /opt/luftpause/bin/pip check \
    && /opt/luftpause/bin/luftpause-dataplane --help > /dev/null \
    && /opt/luftpause/bin/python -m pip uninstall --yes --quiet pip setuptools

FROM base
COPY --from=venv /opt/luftpause /opt/luftpause
ENV PATH=/opt/luftpause/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LUFTPAUSE_HOST=0.0.0.0

# ---- service: everything below is this image's own.
ENV LUFTPAUSE_SCHEDULER=scheduler:5000
USER 10001:10001
EXPOSE 8080
# Ready once it has reached its scheduler; it stays ready while the scheduler restarts.
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('LUFTPAUSE_PORT', '8080') + '/ready', timeout=2)"]
ENTRYPOINT ["luftpause-dataplane"]
