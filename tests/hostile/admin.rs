//! The admin API: lying and huge lengths, slow bodies, many connections, a fuzzer while traffic flows.
