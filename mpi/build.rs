// libmpi_abi.so.1 is linked from this crate's static library by the Makefile (`make mpi`),
// not as a cargo cdylib: cargo hands a dependency's `rustc-cdylib-link-arg`s (distcomm's
// soname and version script) to every cdylib that depends on it (rust-lang/cargo#9562), and
// the last -soname wins, which would make this library claim to be libdistcomm.so.0.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
}
