<?php
// A php-memcached peer for interop_test.go:
//
//   php peer.php SERVERS write|read|locate PREFIX COUNT
//
// SERVERS is host:port:weight,..., split at the last two colons, so that an
// IPv6 host is written bare, as libmemcached takes it (::1:11212:1). write sets PREFIX0 .. PREFIX(COUNT-1),
// each to its own key as the value; read gets them and prints how many it
// found with the right value; locate prints each key's server, key TAB
// host:port a line, from php-memcached's getServerByKey, which connects to
// nothing (so the servers may be names no DNS resolves here). It exits
// non-zero on any other error.
if ($argc != 5) {
    fwrite(STDERR, "usage: php peer.php host:port:weight,... write|read|locate PREFIX COUNT\n");
    exit(2);
}
[, $list, $mode, $prefix, $count] = $argv;
$count = (int)$count;
$hits = 0;

$m = new Memcached();
// The mode under test: libmemcached's weighted ketama, md5 keys.
$m->setOption(Memcached::OPT_LIBKETAMA_COMPATIBLE, true);
// Defaults that would change the bytes on the wire: values over 2000 bytes
// are compressed (ours are short, but say so), and a prefix would change
// the keys that are hashed. Strings are stored as they are, with flags 0,
// whatever the serializer, which gomemcache reads and writes as plain bytes.
$m->setOption(Memcached::OPT_COMPRESSION, false);
$m->setOption(Memcached::OPT_PREFIX_KEY, "");
$m->setOption(Memcached::OPT_BINARY_PROTOCOL, false);
$servers = [];
foreach (explode(",", $list) as $s) {
    $hostPort = substr($s, 0, strrpos($s, ":"));
    $p = strrpos($hostPort, ":");
    [$host, $port, $weight] = [substr($hostPort, 0, $p), substr($hostPort, $p + 1), substr($s, strrpos($s, ":") + 1)];
    $servers[] = [$host, (int)$port, (int)$weight];
}
if (!$m->addServers($servers)) {
    fwrite(STDERR, "addServers: " . $m->getResultMessage() . "\n");
    exit(1);
}

$keys = [];
for ($i = 0; $i < $count; $i++) {
    $keys[] = $prefix . $i;
}
if ($mode === "locate") {
    foreach ($keys as $k) {
        $s = $m->getServerByKey($k);
        echo $k, "\t", $s["host"], ":", $s["port"], "\n";
    }
    exit(0);
}
// In batches, so that no request is huge.
foreach (array_chunk($keys, 500) as $batch) {
    if ($mode === "write") {
        if (!$m->setMulti(array_combine($batch, $batch))) {
            fwrite(STDERR, "setMulti: " . $m->getResultMessage() . "\n");
            exit(1);
        }
        continue;
    }
    $got = $m->getMulti($batch);
    if ($got === false) {
        fwrite(STDERR, "getMulti: " . $m->getResultMessage() . "\n");
        exit(1);
    }
    foreach ($got as $k => $v) {
        if ($v === $k) {
            $hits++;
        }
    }
}
if ($mode === "read") {
    echo (int)$hits, "\n";
}
