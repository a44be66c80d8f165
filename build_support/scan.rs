//! Reads the crate's own sources with `syn`, following `mod` declarations from `src/lib.rs` the
//! way rustc does, and collects what the C ABI tooling needs: exported `extern "C"` functions,
//! `#[repr(C)]` structs, type aliases, fieldless enums with their discriminants, and constants.
//!
//! Shared by `build.rs` (header generation, the struct-layout table for `tests/abi.rs`) and by
//! the tests, through `#[path]` includes. Not every caller uses every part.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A fieldless enum: its `#[repr(..)]` (as written: "C", "u32", ...) and variants with values.
#[derive(Debug, Clone)]
pub struct EnumItem {
    pub name: String,
    pub repr: Option<String>,
    pub variants: Vec<(String, i128)>,
}

/// A `#[repr(C)]` struct with named fields.
#[derive(Debug, Clone)]
pub struct StructItem {
    pub name: String,
    /// Module path inside the crate (`["ffi", "types"]`).
    pub module: Vec<String>,
    /// The struct and every module on the way to it are `pub`: nameable from outside the crate.
    pub reachable: bool,
    pub fields: Vec<(String, syn::Type)>,
}

/// A function exported with an unmangled name and the C ABI.
#[derive(Debug, Clone)]
pub struct FnItem {
    /// The symbol name (`#[export_name]` if present, else the identifier).
    pub name: String,
    pub inputs: Vec<syn::Type>,
    pub output: Option<syn::Type>,
    pub file: PathBuf,
}

/// A `const` or `static` item at module level.
#[derive(Debug, Clone)]
pub struct ConstItem {
    pub name: String,
    pub ty: syn::Type,
    pub expr: Option<syn::Expr>,
}

#[derive(Debug, Default)]
pub struct Scan {
    pub functions: Vec<FnItem>,
    pub structs: Vec<StructItem>,
    pub enums: Vec<EnumItem>,
    pub aliases: BTreeMap<String, syn::Type>,
    pub consts: Vec<ConstItem>,
    /// Associated constants of inherent impls: (type name, constant name).
    pub assoc_consts: Vec<(String, String)>,
    pub files: Vec<PathBuf>,
}

/// Scans the crate rooted at `src_root` (the path of `src/lib.rs`).
pub fn scan_crate(lib_rs: &Path) -> Result<Scan, String> {
    let mut scan = Scan::default();
    scan_file(lib_rs, true, &[], true, &mut scan)?;
    Ok(scan)
}

fn scan_file(
    path: &Path,
    is_mod_rs: bool,
    module: &[String],
    reachable: bool,
    scan: &mut Scan,
) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let file = syn::parse_file(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    scan.files.push(path.to_path_buf());
    // Directory in which `mod x;` declared in this file looks for x.rs / x/mod.rs.
    let parent = path.parent().unwrap_or(Path::new("."));
    let sub_dir = if is_mod_rs {
        parent.to_path_buf()
    } else {
        parent.join(path.file_stem().unwrap_or_default())
    };
    scan_items(&file.items, path, parent, &sub_dir, module, reachable, scan)
}

#[allow(clippy::too_many_arguments)]
fn scan_items(
    items: &[syn::Item],
    file: &Path,
    file_dir: &Path,
    sub_dir: &Path,
    module: &[String],
    reachable: bool,
    scan: &mut Scan,
) -> Result<(), String> {
    for item in items {
        match item {
            syn::Item::Mod(m) => {
                if is_cfg_test(&m.attrs) {
                    continue;
                }
                let name = m.ident.to_string();
                let mut child = module.to_vec();
                child.push(name.clone());
                let child_reachable = reachable && is_pub(&m.vis);
                if let Some((_, inner)) = &m.content {
                    let dir = sub_dir.join(&name);
                    scan_items(inner, file, file_dir, &dir, &child, child_reachable, scan)?;
                } else {
                    let (path, is_mod_rs) = if let Some(p) = path_attr(&m.attrs) {
                        (file_dir.join(p), true)
                    } else {
                        let flat = sub_dir.join(format!("{name}.rs"));
                        if flat.exists() {
                            (flat, false)
                        } else {
                            (sub_dir.join(&name).join("mod.rs"), true)
                        }
                    };
                    scan_file(&path, is_mod_rs, &child, child_reachable, scan)?;
                }
            }
            syn::Item::Fn(f) => {
                let Some(name) = export_name(&f.attrs, &f.sig.ident) else { continue };
                let c_abi = f.sig.abi.as_ref().and_then(|a| a.name.as_ref()).map(|n| n.value());
                if !matches!(c_abi.as_deref(), Some("C") | Some("C-unwind")) {
                    continue;
                }
                let inputs = f
                    .sig
                    .inputs
                    .iter()
                    .filter_map(|a| match a {
                        syn::FnArg::Typed(t) => Some((*t.ty).clone()),
                        syn::FnArg::Receiver(_) => None,
                    })
                    .collect();
                let output = match &f.sig.output {
                    syn::ReturnType::Default => None,
                    syn::ReturnType::Type(_, t) => Some((**t).clone()),
                };
                scan.functions.push(FnItem { name, inputs, output, file: file.to_path_buf() });
            }
            syn::Item::Struct(s) => {
                if !has_repr(&s.attrs, "C") || !s.generics.params.is_empty() {
                    continue;
                }
                let syn::Fields::Named(named) = &s.fields else { continue };
                let fields = named
                    .named
                    .iter()
                    .map(|f| (f.ident.as_ref().unwrap().to_string(), f.ty.clone()))
                    .collect();
                scan.structs.push(StructItem {
                    name: s.ident.to_string(),
                    module: module.to_vec(),
                    reachable: reachable && is_pub(&s.vis),
                    fields,
                });
            }
            syn::Item::Enum(e) => {
                if e.variants.iter().any(|v| !matches!(v.fields, syn::Fields::Unit)) {
                    continue;
                }
                let mut next = 0i128;
                let mut variants = Vec::new();
                for v in &e.variants {
                    if let Some((_, expr)) = &v.discriminant {
                        match eval_int(expr) {
                            Some(x) => next = x,
                            None => continue,
                        }
                    }
                    variants.push((v.ident.to_string(), next));
                    next += 1;
                }
                scan.enums.push(EnumItem { name: e.ident.to_string(), repr: repr_of(&e.attrs), variants });
            }
            syn::Item::Type(t) => {
                scan.aliases.insert(t.ident.to_string(), (*t.ty).clone());
            }
            syn::Item::Const(c) => scan.consts.push(ConstItem {
                name: c.ident.to_string(),
                ty: (*c.ty).clone(),
                expr: Some((*c.expr).clone()),
            }),
            syn::Item::Static(s) => scan.consts.push(ConstItem {
                name: s.ident.to_string(),
                ty: (*s.ty).clone(),
                expr: None,
            }),
            syn::Item::Impl(imp) if imp.trait_.is_none() => {
                let syn::Type::Path(tp) = &*imp.self_ty else { continue };
                let Some(last) = tp.path.segments.last() else { continue };
                for it in &imp.items {
                    if let syn::ImplItem::Const(c) = it {
                        scan.assoc_consts.push((last.ident.to_string(), c.ident.to_string()));
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

fn is_pub(vis: &syn::Visibility) -> bool {
    matches!(vis, syn::Visibility::Public(_))
}

fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Ident>().map(|i| i == "test").unwrap_or(false)
    })
}

fn path_attr(attrs: &[syn::Attribute]) -> Option<String> {
    attrs.iter().find_map(|a| match &a.meta {
        syn::Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
            syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(s), .. }) => Some(s.value()),
            _ => None,
        },
        _ => None,
    })
}

/// The unmangled symbol name of a function: `#[no_mangle]`, `#[unsafe(no_mangle)]`,
/// `#[export_name = ".."]` or `#[unsafe(export_name = "..")]`; `None` when mangled.
fn export_name(attrs: &[syn::Attribute], ident: &syn::Ident) -> Option<String> {
    for a in attrs {
        let meta = if a.path().is_ident("unsafe") {
            match a.parse_args::<syn::Meta>() {
                Ok(m) => m,
                Err(_) => continue,
            }
        } else {
            a.meta.clone()
        };
        match &meta {
            syn::Meta::Path(p) if p.is_ident("no_mangle") => return Some(ident.to_string()),
            syn::Meta::NameValue(nv) if nv.path.is_ident("export_name") => {
                if let syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(s), .. }) = &nv.value {
                    return Some(s.value());
                }
            }
            _ => {}
        }
    }
    None
}

fn repr_of(attrs: &[syn::Attribute]) -> Option<String> {
    let mut found = None;
    for a in attrs.iter().filter(|a| a.path().is_ident("repr")) {
        let _ = a.parse_nested_meta(|m| {
            if let Some(id) = m.path.get_ident() {
                let id = id.to_string();
                // `repr(C, u8)` means u8; plain `repr(C)` means C.
                if found.is_none() || id != "C" {
                    found = Some(id);
                }
            }
            Ok(())
        });
    }
    found
}

fn has_repr(attrs: &[syn::Attribute], want: &str) -> bool {
    let mut yes = false;
    for a in attrs.iter().filter(|a| a.path().is_ident("repr")) {
        let _ = a.parse_nested_meta(|m| {
            if m.path.is_ident(want) {
                yes = true;
            }
            Ok(())
        });
    }
    yes
}

/// Evaluates an integer literal, possibly negated, parenthesised or cast (`-1`, `(4)`, `7 as i32`).
pub fn eval_int(expr: &syn::Expr) -> Option<i128> {
    match expr {
        syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Int(i), .. }) => i.base10_parse::<i128>().ok(),
        syn::Expr::Unary(syn::ExprUnary { op: syn::UnOp::Neg(_), expr, .. }) => eval_int(expr).map(|v| -v),
        syn::Expr::Paren(p) => eval_int(&p.expr),
        syn::Expr::Group(g) => eval_int(&g.expr),
        syn::Expr::Cast(c) => eval_int(&c.expr),
        _ => None,
    }
}
