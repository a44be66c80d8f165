//! Init-method URLs, host:port strings and the environment a job is configured from: the input
//! is split at NUL bytes into an init_method, a backend and `NAME=value` environment entries.
#![no_main]
use distcomm::rendezvous::config::{parse_host_port, parse_method, resolve, InitOptions};
use libfuzzer_sys::fuzz_target;
use std::collections::HashMap;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.split('\0');
    let method = parts.next().unwrap_or("").to_string();
    let backend = parts.next().unwrap_or("").to_string();
    let _ = parse_method(&method);
    let _ = parse_host_port(&method, "fuzz");
    let env: HashMap<String, String> =
        parts.filter_map(|kv| kv.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let opts = InitOptions {
        init_method: (!method.is_empty()).then_some(method),
        backend: (!backend.is_empty()).then_some(backend),
        rank: data.first().map_or(-1, |&b| b as i8 as i32),
        world_size: data.last().map_or(-1, |&b| b as i8 as i32),
        group_name: None,
        timeout_ms: 0,
        token: None,
        encrypt: None,
    };
    let _ = resolve(&opts, &|k| env.get(k).cloned());
});
