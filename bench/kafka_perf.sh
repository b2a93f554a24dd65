#!/usr/bin/env bash
# kafka_perf.sh: Kafka's own ProducerPerformance and ConsumerPerformance (from the jars of
# ops/stack, the same broker) with the record size and count bench_bus uses, as a reference
# for bench_bus's figures. Java's producer is configured like lt_bus's: acks=all, idempotent,
# linger 5 ms; 3 partitions.
#
#   bench/kafka_perf.sh [N [RECORD_SIZE]]     (defaults 100000 records of 143 bytes, the size
#                                              of bench_bus's lt_avro-encoded StepCompleted)
# Environment: LATHE_KAFKA_BOOTSTRAP (default 127.0.0.1:9092). Needs `ops/stack up`.
# Last line: `kafka_producer_perf_rec_per_s: X`.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
n=${1:-100000}
size=${2:-143}
bootstrap=${LATHE_KAFKA_BOOTSTRAP:-127.0.0.1:9092}
topic="bench-perf-$$-$(date +%s)"
tool() { "$repo/ops/stack" kafka-tool "$@"; }

"$repo/ops/stack" status >/dev/null || { echo "kafka_perf.sh: the stack is not up: run ops/stack up" >&2; exit 1; }
tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$bootstrap" --create \
  --topic "$topic" --partitions 3 --replication-factor 1 >/dev/null
trap 'tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$bootstrap" --delete --topic "$topic" >/dev/null 2>&1 || true' EXIT

echo "kafka_perf.sh: ProducerPerformance, $n records of $size bytes, topic $topic"
out=$(tool org.apache.kafka.tools.ProducerPerformance --topic "$topic" --num-records "$n" \
  --record-size "$size" --throughput -1 \
  --producer-props bootstrap.servers="$bootstrap" acks=all enable.idempotence=true linger.ms=5)
echo "$out" | tail -1
rate=$(echo "$out" | tail -1 | sed -E 's/^[0-9]+ records sent, ([0-9.]+) records\/sec.*/\1/')

echo "kafka_perf.sh: ConsumerPerformance, $n records"
tool org.apache.kafka.tools.ConsumerPerformance --bootstrap-server "$bootstrap" --topic "$topic" \
  --messages "$n" --timeout 60000 | tail -2

echo "kafka_producer_perf_rec_per_s: $rate"
