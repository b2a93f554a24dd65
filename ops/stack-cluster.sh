# Sourced by ops/stack (not run by itself): the local stack as a Kafka cluster, `ops/stack up
# --brokers N`, and the fault commands of chaos tests (`ops/stack broker|s3 stop|start`).
#
# Layout: one dedicated KRaft controller (node id 100, CONTROLLER_PORT) and N broker-only nodes
# (node n: node id n + 1, clients on KAFKA_PORT + 2n, data kafka/data<n>, log logs/kafka<n>.log;
# node 0 keeps the single broker's names). Why not N combined broker+controller nodes, which
# would save a JVM: the faults this stack injects are broker faults, and with combined nodes two
# brokers down are two of three controllers down too. The quorum is then lost, so the surviving
# leader can neither shrink its ISR nor be fenced out of it; an acks=all produce is appended and
# times out instead of being refused with NOT_ENOUGH_REPLICAS, and no leader can be elected
# anywhere. Three dedicated controllers would keep quorum through a controller fault as well,
# but cost three more JVMs on a two-core machine; the controller is not what these tests break.
#
# From 3 brokers on: replication factor 3 and min.insync.replicas=2 for Lathe's topics (set on
# each topic, and the broker default for the topics tests make), the consumer offsets and
# transaction state topics (transaction.state.log.min.isr=2). Brokers heartbeat every 500 ms and
# the controller fences one silent for 4 s, so a killed leader is replaced within seconds.

# Heap of a cluster broker: four JVMs share the machine, and the quick compiler alone (C1) keeps
# their start from taking both cores for long.
cluster_broker_jvm=(-Xms128m -Xmx512m -XX:TieredStopAtLevel=1)
controller_node_id=100

replication() { if [ "$brokers" -ge 3 ]; then echo 3; else echo "$brokers"; fi; }
min_isr() { if [ "$brokers" -ge 3 ]; then echo 2; else echo 1; fi; }

# choose_brokers [--brokers N]: settles $brokers for `up`: N, else the count the stack dir was
# brought up with, else 1. Another count than the one whose storage exists wants a wipe first.
choose_brokers() {
  local want=""
  while [ $# -gt 0 ]; do
    case $1 in
      --brokers) [ $# -ge 2 ] || die "up: --brokers wants a number"; want=$2; shift 2 ;;
      --brokers=*) want=${1#--brokers=}; shift ;;
      *) die "up: unknown argument '$1' (want --brokers N)" ;;
    esac
  done
  [ -z "$want" ] && return 0
  [[ $want =~ ^[1-9]$ ]] || die "up: --brokers wants 1 to 9, got '$want'"
  if [ "$want" != "$brokers" ] && compgen -G "$kafka_dir/data*/meta.properties" >/dev/null; then
    die "$stack_dir holds a stack of $brokers broker(s); ops/stack wipe first to make one of $want"
  fi
  brokers=$want
  if [ "$brokers" -gt 1 ]; then
    local n p ports=" $controller_port "
    for ((n = 0; n < brokers; n++)); do
      p=$(node_port $n)
      [[ $ports == *" $p "* ]] && die "broker node $n's port $p is the controller's (LATHE_STACK_CONTROLLER_PORT); pick ports apart"
      ports+="$p "
    done
  fi
  mkdir -p "$stack_dir"
  echo "$brokers" >"$brokers_file"
}

# write_cluster_configs BROKER_PASSWORD CONTROLLER_PASSWORD JAAS_USERS: the controller's
# and every broker node's server properties (mode 0600: they hold the passwords).
write_cluster_configs() {
  local bpw=$1 cpw=$2 users=$3 n port rf isr
  rf=$(replication)
  isr=$(min_isr)
  local voters="$controller_node_id@$kafka_host:$controller_port"
  local ctl_jaas="org.apache.kafka.common.security.plain.PlainLoginModule required username=\"controller\" password=\"$cpw\" user_controller=\"$cpw\";"
  (umask 077; cat >"$kafka_dir/controller.properties" <<EOF
# Written by ops/stack; edits are overwritten on the next 'up'. Holds passwords: mode 0600.
# The cluster's one controller (ops/stack-cluster.sh says why a dedicated one).
process.roles=controller
node.id=$controller_node_id
controller.quorum.voters=$voters
listeners=CONTROLLER://$kafka_host:$controller_port
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:SASL_PLAINTEXT
sasl.enabled.mechanisms=PLAIN
sasl.mechanism.controller.protocol=PLAIN
listener.name.controller.sasl.enabled.mechanisms=PLAIN
listener.name.controller.plain.sasl.jaas.config=$ctl_jaas
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:broker;User:controller
log.dirs=$kafka_dir/controller-data
# A broker silent for 4 s is fenced: out of every ISR, its leaders moved.
broker.session.timeout.ms=4000
num.io.threads=2
num.network.threads=1
EOF
  )
  for ((n = 0; n < brokers; n++)); do
    port=$(node_port $n)
    (umask 077; cat >"$(node_config $n)" <<EOF
# Written by ops/stack; edits are overwritten on the next 'up'. Holds passwords: mode 0600.
# Broker node $n of $brokers (ops/stack-cluster.sh).
process.roles=broker
node.id=$((n + 1))
controller.quorum.voters=$voters
# Clients and the other brokers authenticate with SASL PLAIN (ops/stack says why not SCRAM), the
# brokers to the controller too. No PLAINTEXT listener: nothing is anonymous.
listeners=CLIENT://$kafka_host:$port
advertised.listeners=CLIENT://$kafka_host:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=CLIENT
listener.security.protocol.map=CONTROLLER:SASL_PLAINTEXT,CLIENT:SASL_PLAINTEXT
sasl.enabled.mechanisms=PLAIN
sasl.mechanism.inter.broker.protocol=PLAIN
listener.name.client.sasl.enabled.mechanisms=PLAIN
listener.name.client.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="broker" password="$bpw"$users;
sasl.mechanism.controller.protocol=PLAIN
listener.name.controller.sasl.enabled.mechanisms=PLAIN
listener.name.controller.plain.sasl.jaas.config=$ctl_jaas
# ACLs (ops/acls.tsv): what is not allowed is denied.
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:broker;User:controller
log.dirs=$(node_data $n)
# $rf replicas of every topic, $isr of them in sync before an acks=all write is taken.
default.replication.factor=$rf
min.insync.replicas=$isr
offsets.topic.replication.factor=$rf
offsets.topic.num.partitions=6
transaction.state.log.replication.factor=$rf
transaction.state.log.min.isr=$isr
transaction.state.log.num.partitions=6
share.coordinator.state.topic.replication.factor=$rf
share.coordinator.state.topic.min.isr=$isr
unclean.leader.election.enable=false
broker.heartbeat.interval.ms=500
replica.lag.time.max.ms=10000
group.initial.rebalance.delay.ms=0
# Topics come from ops/topics.tsv (or a test's admin request), never from a typo.
auto.create.topics.enable=false
num.partitions=1
# Two shared cores, four JVMs.
num.network.threads=2
num.io.threads=2
num.replica.fetchers=1
num.recovery.threads.per.data.dir=1
log.segment.bytes=134217728
EOF
    )
  done
}

# Formats the storage that is not yet: the controller's with Kafka's StorageTool (it writes the
# bootstrap metadata), a broker's by writing the meta.properties that the tool would (a broker
# needs no more; one JVM each would cost seconds of both cores).
format_cluster() {
  local n data id
  id=$(cluster_id)
  format_storage "$kafka_dir/controller.properties" "$kafka_dir/controller-data" "$logs_dir/controller.log"
  for ((n = 0; n < brokers; n++)); do
    data=$(node_data $n)
    [ -f "$data/meta.properties" ] && continue
    mkdir -p "$data"
    printf '#\n#Written by ops/stack\nnode.id=%s\ndirectory.id=%s\nversion=1\ncluster.id=%s\n' \
      $((n + 1)) "$(new_cluster_id)" "$id" >"$data/meta.properties.tmp"
    mv "$data/meta.properties.tmp" "$data/meta.properties"
    say "formatted Kafka storage $data (cluster id $id)"
  done
}

start_controller() {
  if pid_of controller >/dev/null; then say "controller already running (pid $(pid_of controller))"; return 0; fi
  port_open $kafka_host $controller_port && die "port $controller_port is taken by a process that is not this stack's controller ($stack_dir)"
  format_storage "$kafka_dir/controller.properties" "$kafka_dir/controller-data" "$logs_dir/controller.log"
  say "starting the kafka controller on $kafka_host:$controller_port, log $logs_dir/controller.log"
  start_daemon controller "$logs_dir/controller.log" "$java_bin" \
    -Xms64m -Xmx256m -XX:TieredStopAtLevel=1 -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:+ExitOnOutOfMemoryError \
    -Djava.awt.headless=true -Dlog4j2.configurationFile="$kafka_dir/log4j2.properties" \
    -Dkafka.logs.dir="$logs_dir" \
    -cp "$(kafka_cp)" $kafka_main "$kafka_dir/controller.properties"
}

# acls_seen N: broker node N already authorizes by the ACLs `up` just made: it shows the admin
# principal the first topic of ops/topics.tsv (a broker applies new ACLs a moment after the
# controller took them, each at its own pace).
acls_seen() {
  local t
  t=$prefix$(awk -F'\t' '!/^#/ && NF { print $1; exit }' "$repo/ops/topics.tsv")
  timeout 10 kcat -b "$kafka_host:$(node_port "$1")" -F "$clients_dir/admin.properties" -L -t "$t" 2>/dev/null |
    grep -q "topic \"$t\" with [1-9][0-9]* partitions:$"
}

# wait_acls: every broker node authorizes by the new ACLs (a client of any of them is let in).
wait_acls() {
  local n
  sasl_on || return 0
  for ((n = 0; n < brokers; n++)); do wait_until "$(node_name $n)" "$(node_log $n)" acls_seen $n; done
}

# ---------------------------------------------------------------- faults

# ops/stack broker stop|start N, broker list.
cmd_broker() {
  local verb=${1:-} n=${2:-} name pid
  case $verb in
    list)
      for ((n = 0; n < brokers; n++)); do
        pid=$(pid_of "$(node_name $n)") || pid=down
        echo "$n $(node_port $n) $pid"
      done
      return 0 ;;
    stop | start) ;;
    *) die "broker: want stop N, start N or list, got '${verb}'" ;;
  esac
  [[ $n =~ ^[0-9]+$ ]] && [ "$n" -lt "$brokers" ] ||
    die "broker $verb: want a node from 0 to $((brokers - 1)), got '$n'"
  name=$(node_name "$n")
  mkdir -p "$logs_dir" "$run_dir"
  # The lock covers the kill or the start, not the wait for an answer: two nodes (and S3) may
  # come back at once.
  take_lock
  if [ "$verb" = stop ]; then kill_daemon "$name"; return 0; fi
  [ "$brokers" -gt 1 ] && ! pid_of controller >/dev/null && say "warning: the controller is not running (ops/stack up)"
  # Configs are written by `up`; rewriting them here could truncate the file of a node that
  # another `broker start` just launched.
  [ -f "$(node_config "$n")" ] || write_kafka_config
  start_node "$n"
  exec 9>&-
  wait_until "$name" "$(node_log "$n")" node_answers "$n"
  say "$name answers on $kafka_host:$(node_port "$n")"
}

# ops/stack s3 stop|start.
cmd_s3() {
  mkdir -p "$logs_dir" "$run_dir"
  case ${1:-} in
    stop) take_lock; kill_daemon s3 ;;
    start)
      take_lock
      start_s3
      exec 9>&-
      wait_until s3 "$logs_dir/s3.log" s3_answers
      say "s3 answers on $s3_host:$s3_port" ;;
    sweep)
      [[ ${2:-60} =~ ^[0-9]+$ ]] || die "s3 sweep: AGE is whole seconds, got '${2:-}'"
      clean_s3_partials "${2:-60}" ;;
    *) die "s3: want stop, start or sweep, got '${1:-}'" ;;
  esac
}
