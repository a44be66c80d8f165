//! Error classes, codes and strings that the program adds (MPI_Add_error_class/code/string)
//! and removes (MPI_Remove_error_class/code/string, MPI 4.1). Their values start at
//! USER_BASE, far above MPI_ERR_LASTCODE and above the codes `err` makes for its messages
//! ((slot + 1) << 14 | class, below 2^27), so the three kinds of value never meet. A removed
//! value is handed out again by a later add (MPICH's `adderr` adds and removes 1.6 million).

use crate::abi_gen::*;
use crate::err::MpiErr;
use crate::mpi_err;
use std::ffi::c_int;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Mutex;

pub const USER_BASE: c_int = 0x4000_0000;

struct Entry {
    /// The class of a code; a class is its own value.
    class: c_int,
    text: Option<String>,
    live: bool,
    /// A class's live codes.
    codes: u32,
}

/// Every value handed out (by `value - USER_BASE`), and the removed ones to hand out again.
struct Table {
    entries: Vec<Entry>,
    removed: Vec<usize>,
}

static USER: Mutex<Table> = Mutex::new(Table { entries: Vec::new(), removed: Vec::new() });
/// MPI_LASTUSEDCODE's value: the largest value handed out so far.
static LASTUSED: AtomicI32 = AtomicI32::new(MPI_ERR_LASTCODE);

fn lock() -> std::sync::MutexGuard<'static, Table> {
    USER.lock().unwrap_or_else(|p| p.into_inner())
}

pub fn is_user(v: c_int) -> bool {
    v >= USER_BASE
}

fn add(t: &mut Table, class: Option<c_int>) -> Result<c_int, MpiErr> {
    let i = match t.removed.pop() {
        Some(i) => i,
        None if t.entries.len() < (1 << 24) => {
            t.entries.push(Entry { class: 0, text: None, live: false, codes: 0 });
            t.entries.len() - 1
        }
        None => return mpi_err!(MPI_ERR_OTHER, "no error values left"),
    };
    let value = USER_BASE + i as c_int;
    t.entries[i] = Entry { class: class.unwrap_or(value), text: None, live: true, codes: 0 };
    if let Some(c) = class.filter(|&c| is_user(c)) {
        t.entries[(c - USER_BASE) as usize].codes += 1;
    }
    LASTUSED.fetch_max(value, Ordering::Relaxed);
    Ok(value)
}

pub fn add_class() -> Result<c_int, MpiErr> {
    add(&mut lock(), None)
}

/// A new code of `class`: a predefined class or a live added one.
pub fn add_code(class: c_int) -> Result<c_int, MpiErr> {
    let mut v = lock();
    let ok = if is_user(class) {
        v.entries.get((class - USER_BASE) as usize).is_some_and(|e| e.live && e.class == class)
    } else {
        crate::err::class_name(class).is_some() && class != MPI_SUCCESS
    };
    if !ok {
        return mpi_err!(MPI_ERR_ARG, "{class} is not an error class");
    }
    add(&mut v, Some(class))
}

/// The live entry of an added class or code, or MPI_ERR_ARG.
fn entry(t: &mut Table, value: c_int) -> Result<&mut Entry, MpiErr> {
    if !is_user(value) {
        return mpi_err!(MPI_ERR_ARG, "{value} is not an error class or code added by MPI_Add_error_class/code");
    }
    match t.entries.get_mut((value - USER_BASE) as usize) {
        Some(e) if e.live => Ok(e),
        _ => mpi_err!(MPI_ERR_ARG, "{value} is not an added error class or code (never added, or removed)"),
    }
}

/// MPI_Add_error_string: sets (or replaces) the string of an added class or code.
pub fn add_string(value: c_int, text: &str) -> Result<(), MpiErr> {
    if text.len() >= MPI_MAX_ERROR_STRING as usize {
        return mpi_err!(MPI_ERR_ARG, "the string has {} bytes, more than MPI_MAX_ERROR_STRING - 1", text.len());
    }
    let mut v = lock();
    entry(&mut v, value)?.text = Some(text.to_string());
    Ok(())
}

pub fn remove_string(value: c_int) -> Result<(), MpiErr> {
    let mut v = lock();
    let e = entry(&mut v, value)?;
    if e.text.take().is_none() {
        return mpi_err!(MPI_ERR_ARG, "{value} has no string (MPI_Add_error_string)");
    }
    Ok(())
}

/// MPI_Remove_error_code: an added code without a string.
pub fn remove_code(code: c_int) -> Result<(), MpiErr> {
    let mut v = lock();
    let e = entry(&mut v, code)?;
    if e.class == code {
        return mpi_err!(MPI_ERR_ARG, "{code} is an error class (MPI_Remove_error_class)");
    }
    if e.text.is_some() {
        return mpi_err!(MPI_ERR_ARG, "error code {code} still has a string (MPI_Remove_error_string first)");
    }
    e.live = false;
    let class = e.class;
    if is_user(class) {
        v.entries[(class - USER_BASE) as usize].codes -= 1;
    }
    v.removed.push((code - USER_BASE) as usize);
    Ok(())
}

/// MPI_Remove_error_class: an added class without a string or live codes.
pub fn remove_class(class: c_int) -> Result<(), MpiErr> {
    let mut v = lock();
    let e = entry(&mut v, class)?;
    if e.class != class {
        return mpi_err!(MPI_ERR_ARG, "{class} is an error code, not a class (MPI_Remove_error_code)");
    }
    if e.text.is_some() {
        return mpi_err!(MPI_ERR_ARG, "error class {class} still has a string (MPI_Remove_error_string first)");
    }
    if e.codes > 0 {
        return mpi_err!(MPI_ERR_ARG, "error class {class} still has {} error codes (MPI_Remove_error_code first)", e.codes);
    }
    e.live = false;
    v.removed.push((class - USER_BASE) as usize);
    Ok(())
}

/// The class of a live added class or code.
pub fn class_of(value: c_int) -> Option<c_int> {
    let v = lock();
    v.entries.get(value.checked_sub(USER_BASE)? as usize).filter(|e| e.live).map(|e| e.class)
}

/// The string of a live added class or code ("" until one is added).
pub fn string_of(value: c_int) -> Option<String> {
    let v = lock();
    v.entries.get(value.checked_sub(USER_BASE)? as usize).filter(|e| e.live).map(|e| e.text.clone().unwrap_or_default())
}

/// Where MPI_LASTUSEDCODE's value lies (the attribute is a pointer to it).
pub fn lastused() -> &'static c_int {
    // SAFETY: an AtomicI32 has the layout of an int, and it lives for the program.
    unsafe { &*(LASTUSED.as_ptr() as *const c_int) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_codes_strings_and_their_removal() {
        let cls = add_class().unwrap();
        assert!(cls > MPI_ERR_LASTCODE && *lastused() == cls);
        assert_eq!((class_of(cls), string_of(cls).as_deref()), (Some(cls), Some("")));
        let c1 = add_code(cls).unwrap();
        assert_eq!((class_of(c1), *lastused()), (Some(cls), c1));
        let other = add_code(MPI_ERR_OTHER).unwrap();
        assert_eq!(class_of(other), Some(MPI_ERR_OTHER));
        assert_eq!(add_code(c1).err().map(|e| e.class), Some(MPI_ERR_ARG), "a code is not a class");
        assert_eq!(add_code(9999).err().map(|e| e.class), Some(MPI_ERR_ARG));
        add_string(c1, "one").unwrap();
        add_string(c1, "uno").unwrap();
        assert_eq!(string_of(c1).as_deref(), Some("uno"));
        assert_eq!(add_string(MPI_ERR_OTHER, "x").err().map(|e| e.class), Some(MPI_ERR_ARG));
        assert!(remove_class(cls).is_err(), "it has a code");
        assert!(remove_code(c1).is_err(), "it has a string");
        remove_string(c1).unwrap();
        assert!(remove_string(c1).is_err());
        remove_code(c1).unwrap();
        assert!(remove_code(c1).is_err() && class_of(c1).is_none());
        remove_class(cls).unwrap();
        assert!(remove_class(cls).is_err() && class_of(cls).is_none());
        assert!(remove_class(MPI_ERR_OTHER).is_err() && remove_code(0).is_err() && remove_string(0).is_err());
        remove_code(other).unwrap();
        // Removed values come back; a class counts its codes.
        let again = add_class().unwrap();
        assert!(again == cls || again == c1 || again == other, "a removed value is reused");
        let codes: Vec<c_int> = (0..3).map(|_| add_code(again).unwrap()).collect();
        assert!(remove_class(again).is_err());
        for c in &codes {
            remove_code(*c).unwrap();
        }
        remove_class(again).unwrap();
        assert!(*lastused() >= codes.iter().copied().max().unwrap());
    }
}
