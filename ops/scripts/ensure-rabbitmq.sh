#!/usr/bin/env bash
# Check that a RabbitMQ server answers AMQP on 127.0.0.1:5672 (the fleet tests run on it as
# well as on Redis). Nothing is installed or started here: say how to, and fail.
set -euo pipefail
URL="${REINS_TEST_AMQP_URL:-amqp://guest:guest@127.0.0.1:5672//}"
PY="${PYTHON:-python3}"
if "$PY" - "$URL" <<'PYEOF' 2>/tmp/reins-rabbitmq-check.$$; then
import sys
from kombu import Connection

with Connection(sys.argv[1], connect_timeout=3) as conn:
    conn.ensure_connection(max_retries=1)
    version = conn.connection.server_properties.get("version", "?")
print(f"RabbitMQ {version} answers at {sys.argv[1]}")
PYEOF
  rm -f /tmp/reins-rabbitmq-check.$$
  exit 0
fi
echo "RabbitMQ is not answering at $URL: $(tail -n 1 /tmp/reins-rabbitmq-check.$$)" >&2
rm -f /tmp/reins-rabbitmq-check.$$
cat >&2 <<'MSG'
The fleet tests run on RabbitMQ too. Start one on 127.0.0.1:5672 with the guest user, e.g.
  sudo systemctl start rabbitmq-server        (or: sudo rabbitmq-server -detached)
  docker run -d --name reins-rabbitmq -p 127.0.0.1:5672:5672 rabbitmq:3.13
or point REINS_TEST_AMQP_URL at one you have (amqp://USER:PASS@HOST:PORT/VHOST).
MSG
exit 1
