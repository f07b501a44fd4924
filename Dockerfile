# Build stage: wheels for the package and its dependencies (compilers stay here).
FROM python:3.11-slim AS build
WORKDIR /src
RUN python -m venv /venv
COPY pyproject.toml README.md ./
COPY controller ./controller
RUN /venv/bin/pip install --no-cache-dir --upgrade pip \
 && /venv/bin/pip install --no-cache-dir .

# Final stage: the virtualenv only, run as an unprivileged user.
FROM python:3.11-slim
ENV PATH=/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /venv /venv
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["weight-controller"]
CMD ["run", "--config", "/etc/weight-controller/config.yaml"]
