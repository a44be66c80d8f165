//! Info objects (ordered key/value strings) and communicator attributes (user keyvals).

use crate::abi_gen::*;
use crate::err::{MpiErr, Res};
use crate::mpi_err;
use crate::state;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::Mutex;

pub const INFO_BASE: usize = 0x7000_0000;

static INFOS: Mutex<Vec<Option<Vec<(String, String)>>>> = Mutex::new(Vec::new());

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn cstr(p: *const c_char, what: &str) -> Result<String, MpiErr> {
    if p.is_null() {
        return mpi_err!(MPI_ERR_ARG, "{what} is NULL");
    }
    // SAFETY: a NUL-terminated string from the caller.
    Ok(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

fn key_of(p: *const c_char) -> Result<String, MpiErr> {
    let k = cstr(p, "key")?;
    if k.is_empty() || k.len() >= MPI_MAX_INFO_KEY as usize {
        return mpi_err!(MPI_ERR_INFO_KEY, "key {k:?} is empty or longer than MPI_MAX_INFO_KEY - 1");
    }
    Ok(k)
}

/// Runs `f` on the entries of an info (MPI_INFO_ENV reads as empty), or MPI_ERR_INFO.
fn with<T>(h: MPI_Info, f: impl FnOnce(&mut Vec<(String, String)>) -> Result<T, MpiErr>) -> Result<T, MpiErr> {
    if h == MPI_INFO_ENV {
        return f(&mut Vec::new());
    }
    let mut v = lock(&INFOS);
    match h.checked_sub(INFO_BASE).and_then(|i| v.get_mut(i)).and_then(|x| x.as_mut()) {
        Some(e) => f(e),
        None if h == MPI_INFO_NULL => mpi_err!(MPI_ERR_INFO, "MPI_INFO_NULL is not an info object"),
        None => mpi_err!(MPI_ERR_INFO, "{h:#x} is not a valid info object (never made, or freed)"),
    }
}

pub(crate) fn add(entries: Vec<(String, String)>) -> MPI_Info {
    let mut v = lock(&INFOS);
    let slot = v.iter().position(|s| s.is_none()).unwrap_or_else(|| {
        v.push(None);
        v.len() - 1
    });
    v[slot] = Some(entries);
    INFO_BASE + slot
}

fn out<'a, T>(p: *mut T, what: &str) -> Result<&'a mut T, MpiErr> {
    // SAFETY: a non-NULL out-pointer from the caller is writable.
    unsafe { p.as_mut() }.ok_or_else(|| MpiErr::new(MPI_ERR_ARG, format!("{what} is NULL")))
}

/// Copies `s` into `buf` of `cap` bytes (NUL-terminated, truncated to fit).
fn put(s: &str, buf: *mut c_char, cap: usize) {
    if buf.is_null() || cap == 0 {
        return;
    }
    let n = s.len().min(cap - 1);
    // SAFETY: the caller's buffer holds `cap` bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf as *mut u8, n);
        *buf.add(n) = 0;
    }
}

pub unsafe fn info_create(info: *mut MPI_Info) -> Res {
    *out(info, "info")? = add(Vec::new());
    Ok(())
}

pub unsafe fn info_free(info: *mut MPI_Info) -> Res {
    let h = out(info, "info")?;
    with(*h, |_| Ok(()))?;
    if *h == MPI_INFO_ENV {
        return mpi_err!(MPI_ERR_INFO, "MPI_INFO_ENV cannot be freed");
    }
    lock(&INFOS)[*h - INFO_BASE] = None;
    *h = MPI_INFO_NULL;
    Ok(())
}

pub unsafe fn info_dup(info: MPI_Info, newinfo: *mut MPI_Info) -> Res {
    let o = out(newinfo, "newinfo")?;
    let copy = with(info, |e| Ok(e.clone()))?;
    *o = add(copy);
    Ok(())
}

pub unsafe fn info_set(info: MPI_Info, key: *const c_char, value: *const c_char) -> Res {
    let (k, v) = (key_of(key)?, cstr(value, "value")?);
    if v.len() >= MPI_MAX_INFO_VAL as usize {
        return mpi_err!(MPI_ERR_INFO_VALUE, "value longer than MPI_MAX_INFO_VAL - 1");
    }
    if info == MPI_INFO_ENV {
        return mpi_err!(MPI_ERR_INFO, "MPI_INFO_ENV is read-only");
    }
    with(info, |e| {
        match e.iter_mut().find(|(ek, _)| *ek == k) {
            Some(x) => x.1 = v,
            None => e.push((k, v)),
        }
        Ok(())
    })
}

pub unsafe fn info_delete(info: MPI_Info, key: *const c_char) -> Res {
    let k = key_of(key)?;
    with(info, |e| match e.iter().position(|(ek, _)| *ek == k) {
        Some(i) => {
            e.remove(i);
            Ok(())
        }
        None => mpi_err!(MPI_ERR_INFO_NOKEY, "key {k:?} is not set"),
    })
}

fn value_of(info: MPI_Info, key: *const c_char) -> Result<Option<String>, MpiErr> {
    let k = key_of(key)?;
    with(info, |e| Ok(e.iter().find(|(ek, _)| *ek == k).map(|(_, v)| v.clone())))
}

pub unsafe fn info_get(info: MPI_Info, key: *const c_char, valuelen: c_int, value: *mut c_char, flag: *mut c_int) -> Res {
    let f = out(flag, "flag")?;
    match value_of(info, key)? {
        Some(v) => {
            put(&v, value, valuelen.max(0) as usize + 1);
            *f = 1;
        }
        None => *f = 0,
    }
    Ok(())
}

pub unsafe fn info_get_string(info: MPI_Info, key: *const c_char, buflen: *mut c_int, value: *mut c_char, flag: *mut c_int) -> Res {
    let f = out(flag, "flag")?;
    let bl = out(buflen, "buflen")?;
    match value_of(info, key)? {
        Some(v) => {
            if *bl > 0 {
                put(&v, value, *bl as usize);
            }
            *bl = v.len() as c_int + 1;
            *f = 1;
        }
        None => *f = 0,
    }
    Ok(())
}

pub unsafe fn info_get_valuelen(info: MPI_Info, key: *const c_char, valuelen: *mut c_int, flag: *mut c_int) -> Res {
    let f = out(flag, "flag")?;
    let l = out(valuelen, "valuelen")?;
    match value_of(info, key)? {
        Some(v) => {
            *l = v.len() as c_int;
            *f = 1;
        }
        None => *f = 0,
    }
    Ok(())
}

pub unsafe fn info_get_nkeys(info: MPI_Info, nkeys: *mut c_int) -> Res {
    let o = out(nkeys, "nkeys")?;
    *o = with(info, |e| Ok(e.len() as c_int))?;
    Ok(())
}

pub unsafe fn info_get_nthkey(info: MPI_Info, n: c_int, key: *mut c_char) -> Res {
    let k = with(info, |e| match e.get(n.max(0) as usize) {
        Some((k, _)) if n >= 0 => Ok(k.clone()),
        _ => mpi_err!(MPI_ERR_ARG, "n = {n} is not below the number of keys ({})", e.len()),
    })?;
    if key.is_null() {
        return mpi_err!(MPI_ERR_ARG, "key is NULL");
    }
    put(&k, key, MPI_MAX_INFO_KEY as usize);
    Ok(())
}

// ---- communicator attributes ---------------------------------------------------------------------

/// User keyvals start above the predefined attribute keys.
const KEYVAL_BASE: c_int = 1000;

#[derive(Clone, Copy)]
struct Keyval {
    copy: usize,
    delete: usize,
    extra: usize,
    live: bool,
}

static KEYVALS: Mutex<Vec<Keyval>> = Mutex::new(Vec::new());

fn keyval(k: c_int) -> Result<Keyval, MpiErr> {
    let v = lock(&KEYVALS);
    match k.checked_sub(KEYVAL_BASE).and_then(|i| v.get(i as usize)) {
        Some(kv) if kv.live => Ok(*kv),
        _ => mpi_err!(MPI_ERR_KEYVAL, "keyval {k} is not a valid communicator keyval"),
    }
}

pub fn is_user_keyval(k: c_int) -> bool {
    keyval(k).is_ok()
}

pub unsafe fn comm_create_keyval(copy: Option<MPI_Comm_copy_attr_function>, delete: Option<MPI_Comm_delete_attr_function>, k: *mut c_int, extra: *mut c_void) -> Res {
    let o = out(k, "comm_keyval")?;
    let mut v = lock(&KEYVALS);
    // MPI_COMM_NULL_COPY_FN is NULL (0), MPI_COMM_DUP_FN is 1: kept as addresses.
    v.push(Keyval { copy: copy.map_or(0, |f| f as usize), delete: delete.map_or(0, |f| f as usize), extra: extra as usize, live: true });
    *o = KEYVAL_BASE + v.len() as c_int - 1;
    Ok(())
}

pub unsafe fn comm_free_keyval(k: *mut c_int) -> Res {
    let h = out(k, "comm_keyval")?;
    keyval(*h)?;
    lock(&KEYVALS)[(*h - KEYVAL_BASE) as usize].live = false;
    *h = MPI_KEYVAL_INVALID;
    Ok(())
}

fn call_delete(kv: &Keyval, comm: MPI_Comm, k: c_int, val: usize) -> Res {
    if kv.delete > 1 {
        // SAFETY: the user's delete function, as the standard specifies it.
        let f: MPI_Comm_delete_attr_function = unsafe { std::mem::transmute::<usize, MPI_Comm_delete_attr_function>(kv.delete) };
        let rc = unsafe { f(comm, k, val as *mut c_void, kv.extra as *mut c_void) };
        if rc != MPI_SUCCESS {
            return mpi_err!(MPI_ERR_OTHER, "the delete callback of keyval {k} returned {rc}");
        }
    }
    Ok(())
}

pub unsafe fn comm_set_attr(c: MPI_Comm, k: c_int, val: *mut c_void) -> Res {
    state::check_active()?;
    let mc = state::get_comm(c)?;
    let kv = keyval(k).map_err(|e| e.on(c))?;
    let old = {
        let mut a = mc.attrs.lock().unwrap_or_else(|p| p.into_inner());
        match a.iter_mut().find(|(ak, _)| *ak == k) {
            Some(x) => Some(std::mem::replace(&mut x.1, val as usize)),
            None => {
                a.push((k, val as usize));
                None
            }
        }
    };
    if let Some(o) = old {
        call_delete(&kv, c, k, o).map_err(|e| e.on(c))?;
    }
    Ok(())
}

/// A user attribute's value (for MPI_Comm_get_attr).
pub fn get_user_attr(mc: &state::MpiComm, k: c_int) -> Option<usize> {
    mc.attrs.lock().unwrap_or_else(|p| p.into_inner()).iter().find(|(ak, _)| *ak == k).map(|x| x.1)
}

pub unsafe fn comm_delete_attr(c: MPI_Comm, k: c_int) -> Res {
    state::check_active()?;
    let mc = state::get_comm(c)?;
    let kv = keyval(k).map_err(|e| e.on(c))?;
    let v = {
        let mut a = mc.attrs.lock().unwrap_or_else(|p| p.into_inner());
        match a.iter().position(|(ak, _)| *ak == k) {
            Some(i) => a.remove(i).1,
            None => return Err(MpiErr::new(MPI_ERR_KEYVAL, format!("keyval {k} has no value on this communicator")).on(c)),
        }
    };
    call_delete(&kv, c, k, v).map_err(|e| e.on(c))
}

/// Runs the delete callbacks of every attribute of a communicator being freed.
pub fn delete_all(mc: &state::MpiComm) {
    let attrs = std::mem::take(&mut *mc.attrs.lock().unwrap_or_else(|p| p.into_inner()));
    for (k, v) in attrs {
        if let Ok(kv) = keyval(k) {
            let _ = call_delete(&kv, mc.handle, k, v);
        }
    }
}

/// The attributes a dup gets: each keyval's copy callback decides (MPI_COMM_DUP_FN copies,
/// MPI_COMM_NULL_COPY_FN does not).
pub fn copied_attrs(old: &state::MpiComm) -> Result<Vec<(c_int, usize)>, MpiErr> {
    let attrs = old.attrs.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let mut out = Vec::new();
    for (k, v) in attrs {
        let Ok(kv) = keyval(k) else { continue };
        match kv.copy {
            0 => {}
            1 => out.push((k, v)),
            f => {
                // SAFETY: the user's copy function, as the standard specifies it.
                let f: MPI_Comm_copy_attr_function = unsafe { std::mem::transmute::<usize, MPI_Comm_copy_attr_function>(f) };
                let (mut newv, mut flag): (*mut c_void, c_int) = (std::ptr::null_mut(), 0);
                let rc = unsafe { f(old.handle, k, kv.extra as *mut c_void, v as *mut c_void, &mut newv as *mut *mut c_void as *mut c_void, &mut flag) };
                if rc != MPI_SUCCESS {
                    return mpi_err!(MPI_ERR_OTHER, "the copy callback of keyval {k} returned {rc}");
                }
                if flag != 0 {
                    out.push((k, newv as usize));
                }
            }
        }
    }
    Ok(out)
}
