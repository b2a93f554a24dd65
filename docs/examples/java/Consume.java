// Reads Lathe records from a Kafka topic with Apache Avro's BinaryMessageDecoder (docs/EVENTS.md).
//
// Every Lathe record is an Avro single-object message (C3 01, the writer schema's CRC-64-AVRO
// fingerprint, the body), which is what BinaryMessageDecoder reads. Java computes fingerprints
// by the specification (SchemaNormalization), so they match Lathe's with no workaround. One
// decoder per record name reads every version of that record as its newest one.
//
// Run with Java 17's source launcher, the jars of pom.xml beside this file on the class path:
//   mvn -q -f docs/examples/java/pom.xml dependency:copy-dependencies -DoutputDirectory=jars
//   java -cp 'jars/*' docs/examples/java/Consume.java SCHEMA_DIR TOPIC BOOTSTRAP [PROPS [MAX [GROUP]]]
// PROPS: a librdkafka properties file such as $LATHE_KAFKA_CONFIG_DIR/admin.properties (its
// SASL/PLAIN settings are translated to the Java client's). Prints one JSON line per record:
// partition, offset, type, version, fingerprint, event_id, ce_type (null without headers).

import java.io.File;
import java.io.FileInputStream;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.*;
import org.apache.avro.Schema;
import org.apache.avro.SchemaNormalization;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.message.BinaryMessageDecoder;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public class Consume {
  record Version(String name, int version, Schema schema) {}

  public static void main(String[] args) throws Exception {
    if (args.length < 3) {
      System.err.println("usage: Consume SCHEMA_DIR TOPIC BOOTSTRAP [PROPS [MAX [GROUP]]]");
      System.exit(2);
    }
    // Every version of every record, by fingerprint (how a record without headers is named).
    Map<Long, Version> byFingerprint = new HashMap<>();
    Map<String, List<Version>> byName = new TreeMap<>();
    for (File f : Objects.requireNonNull(new File(args[0]).listFiles((d, n) -> n.endsWith(".avsc")))) {
      Schema s = new Schema.Parser().parse(f); // a Parser per file: every version reuses its name
      int v = Integer.parseInt(f.getName().replaceAll(".*\\.v(\\d+)\\.avsc$", "$1"));
      Version ver = new Version(s.getName(), v, s);
      byFingerprint.put(SchemaNormalization.parsingFingerprint64(s), ver);
      byName.computeIfAbsent(s.getName(), k -> new ArrayList<>()).add(ver);
    }
    Map<String, BinaryMessageDecoder<GenericRecord>> decoders = new HashMap<>();
    for (var e : byName.entrySet()) {
      Version newest = Collections.max(e.getValue(), Comparator.comparingInt(Version::version));
      var dec = new BinaryMessageDecoder<GenericRecord>(GenericData.get(), newest.schema());
      for (Version w : e.getValue()) dec.addSchema(w.schema());
      decoders.put(e.getKey(), dec);
    }

    Properties p = new Properties();
    if (args.length > 3) p.putAll(fromLibrdkafka(args[3]));
    p.put("bootstrap.servers", args[2]);
    p.put("group.id", args.length > 5 ? args[5] : "lathe-java-example-" + ProcessHandle.current().pid());
    p.put("auto.offset.reset", "earliest");
    p.put("isolation.level", "read_committed"); // the scheduler writes in transactions
    p.put("enable.auto.commit", "false");
    int max = args.length > 4 ? Integer.parseInt(args[4]) : Integer.MAX_VALUE;
    int n = 0, idle = 0;
    try (var c = new KafkaConsumer<byte[], byte[]>(p, new ByteArrayDeserializer(), new ByteArrayDeserializer())) {
      c.subscribe(List.of(args[1]));
      while (n < max && idle < 30) {
        var batch = c.poll(Duration.ofSeconds(1));
        idle = batch.isEmpty() ? idle + 1 : 0;
        for (ConsumerRecord<byte[], byte[]> r : batch) {
          n++;
          byte[] v = r.value();
          long fp = 0;
          for (int i = 9; i >= 2; i--) fp = (fp << 8) | (v[i] & 0xff); // little-endian
          Version w = byFingerprint.get(fp);
          Header t = r.headers().lastHeader("ce_type");
          String ceType = t == null ? null : new String(t.value(), StandardCharsets.UTF_8);
          // ce_type names the record without looking at the value; old records have no headers.
          String name = ceType != null ? ceType.substring("dev.lathe.".length()) : w == null ? null : w.name();
          if (w == null || name == null || !decoders.containsKey(name)) {
            System.out.printf("{\"partition\":%d,\"offset\":%d,\"error\":\"unknown schema\"}%n", r.partition(), r.offset());
            continue;
          }
          GenericRecord rec = decoders.get(name).decode(v);
          System.out.printf("{\"partition\":%d,\"offset\":%d,\"type\":\"%s\",\"version\":%d,\"fingerprint\":\"%s\","
                  + "\"event_id\":\"%s\",\"ce_type\":%s}%n",
              r.partition(), r.offset(), name, w.version(), hex(v), rec.get("event_id"),
              ceType == null ? "null" : "\"" + ceType + "\"");
        }
      }
    }
  }

  static String hex(byte[] v) {
    StringBuilder b = new StringBuilder();
    for (int i = 2; i < 10; i++) b.append(String.format("%02x", v[i]));
    return b.toString();
  }

  // Lathe's client files use librdkafka's names; the Java client spells SASL/PLAIN differently.
  static Properties fromLibrdkafka(String path) throws Exception {
    Properties in = new Properties(), out = new Properties();
    try (var f = new FileInputStream(path)) {
      in.load(f);
    }
    for (String k : in.stringPropertyNames()) {
      String v = in.getProperty(k).trim();
      switch (k) {
        case "security.protocol" -> out.put(k, v.toUpperCase(Locale.ROOT));
        case "sasl.mechanisms" -> out.put("sasl.mechanism", v);
        case "sasl.username", "sasl.password" -> {}
        default -> out.put(k, v);
      }
    }
    if (in.containsKey("sasl.username"))
      out.put("sasl.jaas.config", "org.apache.kafka.common.security.plain.PlainLoginModule required username=\""
          + in.getProperty("sasl.username").trim() + "\" password=\"" + in.getProperty("sasl.password", "").trim() + "\";");
    return out;
  }
}
