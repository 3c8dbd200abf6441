-- wrk -s latency.lua: after the run, one line with the 50th, 99th and
-- 99.9th percentiles of the request latency from wrk's own histogram, in
-- microseconds (`--latency` prints no 99.9th). Read by parse.py.
done = function(summary, latency, requests)
  io.write(string.format("latency_us p50 %d p99 %d p999 %d\n",
    latency:percentile(50), latency:percentile(99), latency:percentile(99.9)))
end
