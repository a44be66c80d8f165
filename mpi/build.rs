// libmpi_abi.so.1 is linked from this crate's static library by the Makefile (`make mpi`), with
// its soname and the MPI_/PMPI_ export list (exports.map). The crate is a static library only
// (see Cargo.toml): fat LTO then calls its functions directly, not through the GOT.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
}
