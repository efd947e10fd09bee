# syntax=docker/dockerfile:1
# Turnout image: the build stage turns pyproject.toml into wheels (the project and every
# dependency); the runtime stage installs only those wheels, offline, as a non-root user.
#
#   docker build -t turnout:0.1.0 .
#   docker run --rm -p 8080:8080 turnout:0.1.0        # embedded default: two emulated engines
#   docker run --rm -p 8080:8080 -v $PWD/my.yaml:/etc/turnout/router.yaml:ro turnout:0.1.0

FROM python:3.11-slim AS build
WORKDIR /src
# pyproject's `readme` is README.md, so the build needs it; the packages are the ones listed
# under [tool.setuptools] packages.
COPY pyproject.toml README.md LICENSE ./
COPY router ./router
COPY policies ./policies
COPY replay ./replay
COPY emulator ./emulator
COPY turnout ./turnout
COPY config ./config
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN useradd --create-home --uid 10001 --user-group turnout \
    && install -d -o turnout -g turnout /var/lib/turnout /etc/turnout
COPY --from=build /wheels /wheels
# --no-index: the runtime stage installs exactly what the build stage resolved, nothing else.
RUN pip install --no-cache-dir --no-index --find-links /wheels turnout \
    && rm -rf /wheels
COPY config/router.yaml /etc/turnout/router.yaml
USER 10001:10001
WORKDIR /var/lib/turnout
EXPOSE 8080
# The slim image has no curl; the standard library is enough for the probe (urlopen raises,
# and so exits non-zero, on a refused connection or a non-2xx answer).
HEALTHCHECK --interval=10s --timeout=3s --start-period=15s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/health', timeout=2)"]
# Exec form: the router is PID 1 and gets SIGTERM itself (it drains, then stops its children).
CMD ["turnout", "serve", "--config", "/etc/turnout/router.yaml", "--host", "0.0.0.0", "--port", "8080"]
