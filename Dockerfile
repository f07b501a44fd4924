# The image: Red Hat's UBI 9 Python 3.11, the dependencies exactly as requirements.lock pins
# them (hashes checked), the package without any dependency of its own. `make image` builds it.
# Build stage: the virtualenv (compilers and pip's cache stay here).
FROM registry.access.redhat.com/ubi9/python-311:1-77.1726664316 AS build
WORKDIR /opt/app-root/src
RUN python -m venv /opt/app-root/wc
COPY requirements.lock pyproject.toml README.md ./
COPY controller ./controller
RUN /opt/app-root/wc/bin/pip install --no-cache-dir --require-hashes -r requirements.lock \
 && /opt/app-root/wc/bin/pip install --no-cache-dir --no-deps .

# Final stage: the same base, the virtualenv only. OpenShift's restricted-v2 runs it as an
# arbitrary UID in group 0; everything it reads is world-readable and it writes nothing.
FROM registry.access.redhat.com/ubi9/python-311:1-77.1726664316
LABEL org.opencontainers.image.title="weight-controller" \
      org.opencontainers.image.description="Keeps LLM traffic away from overloaded clusters by steering routing weights from vLLM/EPP signals." \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.vendor="Open Data Hub" \
      name="weight-controller" \
      summary="Routing weights away from overloaded LLM clusters" \
      io.k8s.display-name="weight-controller" \
      io.openshift.tags="llm,vllm,routing,models-as-a-service"
ENV PATH=/opt/app-root/wc/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/app-root/wc /opt/app-root/wc
USER 1001
EXPOSE 8443
ENTRYPOINT ["weight-controller"]
CMD ["run", "--config", "/etc/weight-controller/config.yaml"]
