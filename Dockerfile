# The wsgateway image: a static binary on an empty base image, run as an unprivileged user.
#
#   docker build -t wsgateway .
#   docker run -p 8080:8080 wsgateway                      # embedded NATS in /data
#   docker compose up --build                              # the scale-out deployment
#
# The build stage's Go version follows go.mod (e2e/compose_test.go checks it).

FROM golang:1.27.3-alpine AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" \
      -o /out/wsgateway ./cmd/wsgateway \
 && mkdir -p /out/data

FROM scratch
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/wsgateway /wsgateway
COPY --from=build --chown=65532:65532 /out/data /data
USER 65532:65532
ENV WSGATEWAY_ADDR=0.0.0.0:8080 \
    WSGATEWAY_DATA_DIR=/data \
    WSGATEWAY_LOG_FORMAT=json
EXPOSE 8080
VOLUME /data
ENTRYPOINT ["/wsgateway"]
CMD ["serve"]
