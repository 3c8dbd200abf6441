//! Failure under pressure: dead backends, exhausted descriptors and threads, the pool after a flood.
