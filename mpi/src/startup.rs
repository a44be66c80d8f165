//! How a process finds its job at MPI_Init: under distcomm's mpiexec/dcrun (or torchrun,
//! Slurm, Open MPI: whatever the engine's env:// reads) the world comes from the environment;
//! under a PMI-1 launcher (MPICH's Hydra `mpiexec`) through PMI (see `pmi`); with no launcher at
//! all the process is a singleton (a world of size 1).

use crate::abi_gen::*;
use crate::err::MpiErr;
use distcomm::comm::Comm;
use distcomm::rendezvous::InitOptions;
use std::sync::Arc;

/// Variables by which some launcher says how large the job is.
const SIZE_VARS: [&str; 5] = ["WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PADDLE_TRAINERS_NUM"];

fn set(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|v| !v.is_empty())
}

pub fn init_world() -> Result<Arc<Comm>, MpiErr> {
    // Under a PMI-1 launcher (MPICH's Hydra mpiexec: PMI_FD), the job is formed through it.
    if let Some(mut p) = crate::pmi::Pmi::connect()? {
        let addr = crate::pmi::store_address(&mut p)?;
        let opts = InitOptions { init_method: Some(format!("tcp://{addr}")), rank: p.rank as i32, world_size: p.size as i32, ..InitOptions::from_env() };
        *crate::pmi::PMI.lock().unwrap_or_else(|e| e.into_inner()) = Some(p);
        return distcomm::init::init(&opts).map_err(|e| {
            let mut m = MpiErr::from(e);
            m.class = MPI_ERR_OTHER;
            m.msg = format!("could not form the job (PMI-1, store at {addr}): {}", m.msg);
            m
        });
    }
    let opts = if SIZE_VARS.iter().any(|v| set(v)) {
        InitOptions::from_env()
    } else {
        // No launcher: a singleton. Its store listens on loopback, on a port the OS just gave
        // us, with a token of its own.
        if std::env::var_os("DC_TOKEN").is_none_or(|t| t.is_empty()) {
            std::env::set_var("DC_TOKEN", crate::pmi::random_token());
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .map_err(|e| MpiErr::new(MPI_ERR_OTHER, format!("singleton start: no free loopback port: {e}")))?;
        InitOptions { init_method: Some(format!("tcp://127.0.0.1:{port}")), rank: 0, world_size: 1, ..InitOptions::from_env() }
    };
    distcomm::init::init(&opts).map_err(|e| {
        let mut m = MpiErr::from(e);
        m.class = MPI_ERR_OTHER;
        m.msg = format!("could not form the job: {}", m.msg);
        m
    })
}
