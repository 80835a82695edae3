use super::*;

/// Where probe bodies are inlined ([`InlineBody`], by symbol), and a count of the
/// instances made so far, which names each one.
pub(super) struct Inlining<'a> {
    bodies: &'a HashMap<&'a str, InlineBody>,
    sites: &'a mut usize,
    /// Statements still allowed ([`crate::inline::MODULE_INLINE_BUDGET`]).
    budget: &'a mut usize,
    /// Whether an instance in this kernel reads the SM's id
    /// ([`crate::inline::SM_REGISTER`]).
    reads_sm: bool,
}

pub(super) fn kernel_edits(
    kernel: &Kernel,
    calls: &[ProbeCall],
    bodies: &HashMap<&str, InlineBody>,
    sites: &mut usize,
    budget: &mut usize,
) -> Vec<(usize, usize, String)> {
    let first_site = *sites;
    let mut inlining = Inlining {
        bodies,
        sites,
        budget,
        reads_sm: false,
    };
    let of = |point| -> Vec<&str> {
        calls
            .iter()
            .filter(|c| c.point == point)
            .map(|c| c.symbol.as_str())
            .collect()
    };
    let (entry, exit) = (of(ProbePoint::Entry), of(ProbePoint::Exit));
    let accesses = [ProbePoint::Access, ProbePoint::SharedAccess].map(|p| (p, of(p)));
    let mut edits = Vec::new();
    if !entry.is_empty() {
        edits.push((
            kernel.body_open + 1,
            0,
            format!(
                "\n{}",
                probe_calls(&kernel.params, &entry, None, None, &mut inlining)
            ),
        ));
    }
    if !exit.is_empty() {
        for site in &kernel.exits {
            let mut code = String::from("\n");
            code.push_str(&probe_calls(
                &kernel.params,
                &exit,
                site.guard.as_deref(),
                None,
                &mut inlining,
            ));
            let original = match &site.guard {
                Some(g) => format!("{g} {};", site.opcode),
                None => format!("{};", site.opcode),
            };
            code.push_str(&original);
            edits.push((site.start, site.end - site.start, code));
        }
    }
    let id = kernel_id(&kernel.name);
    // Calls after their accesses, by where they go: several accesses' calls may go at
    // one place (see `defer_calls`), where they run in their accesses' order.
    let mut after_calls: std::collections::BTreeMap<usize, String> = Default::default();
    for (point, symbols) in accesses.iter().filter(|a| !a.1.is_empty()) {
        // Each kind of probe numbers the sites it sees.
        let sites = kernel.accesses.iter().filter(|a| point.sees(a.space));
        for (index, site) in sites.enumerate() {
            let word = |space: AccessSpace| {
                u64::from(site.size) | (site.kind as u64) << 32 | (space as u64) << 48
            };
            if let Some(tensor) = &site.tensor {
                let calls = tensor_calls(
                    &kernel.params,
                    tensor,
                    site.guard.as_deref(),
                    &format!("$__bt_tensor_{}_{index}", *point as u8),
                    [
                        word(AccessSpace::Global),
                        u64::from(id) | (index as u64) << 32,
                        u64::from(NO_BASE_ARG),
                    ],
                    symbols,
                    &mut inlining,
                );
                after_calls
                    .entry(site.call_at)
                    .or_default()
                    .push_str(&format!("\n{calls}"));
                continue;
            }
            let mut prepare = site.prepare.clone();
            let guard = match site.space {
                SiteSpace::Global => {
                    prepare.push_str(&format!(
                        "mov.u64 %__bta9, {};\n",
                        word(AccessSpace::Global)
                    ));
                    site.guard.as_deref()
                }
                SiteSpace::Shared => {
                    prepare.push_str(&format!(
                        "mov.u64 %__bta9, {};\n",
                        word(AccessSpace::Shared)
                    ));
                    site.guard.as_deref()
                }
                SiteSpace::Generic => {
                    // The calls run where the address is in a space probed, and say which.
                    prepare.push_str("isspacep.global %__btp, %__bta6;\n");
                    if *point == ProbePoint::SharedAccess {
                        prepare.push_str(&format!(
                            "isspacep.shared %__btr, %__bta6;\nor.pred %__btp, %__btp, %__btr;\n\
                             selp.b64 %__bta9, {}, {}, %__btr;\n",
                            word(AccessSpace::Shared),
                            word(AccessSpace::Global)
                        ));
                    } else {
                        prepare.push_str(&format!(
                            "mov.u64 %__bta9, {};\n",
                            word(AccessSpace::Global)
                        ));
                    }
                    guarded("%__btp", site.guard.as_deref(), "%__btq", &mut prepare);
                    Some("@%__btp")
                }
            };
            if let Some(reg) = &site.size_reg {
                prepare.push_str(&format!(
                    "cvt.u64.u32 %__btv, {reg};\nor.b64 %__bta9, %__bta9, %__btv;\n"
                ));
            }
            // A matrix row's probe runs in the lanes that name a row; a probe of an access
            // whose size is in a register, in one lane at a time (the loop below).
            let guard = match (site.lanes, &site.size_reg) {
                (None, None) => guard,
                (Some(n), _) => {
                    prepare.push_str(&format!(
                        "mov.u32 %__btl, %laneid;\nsetp.lt.u32 %__btq, %__btl, {n};\n"
                    ));
                    guarded("%__btq", guard, "%__btr", &mut prepare);
                    Some("@%__btp")
                }
                (None, Some(_)) => {
                    prepare.push_str(
                        "mov.u32 %__btl, %laneid;\nsetp.eq.u32 %__btq, %__btl, %__btk;\n",
                    );
                    guarded("%__btq", guard, "%__btr", &mut prepare);
                    Some("@%__btp")
                }
            };
            prepare.push_str(&format!(
                "mov.u64 %__bta10, {};\nmov.u64 %__bta11, {};\n",
                u64::from(id) | (index as u64) << 32,
                site.base_arg.map_or(NO_BASE_ARG, |i| i as u32)
            ));
            let mut calls = probe_calls(
                &kernel.params,
                symbols,
                guard,
                Some(&prepare),
                &mut inlining,
            );
            if site.size_reg.is_some() {
                let label = format!("$__bt_lane_{}_{index}", *point as u8);
                calls = format!(
                    "{{\n.reg .b32 %__btk;\n.reg .pred %__btz;\nmov.u32 %__btk, 0;\n{label}:\n\
                     {calls}\nadd.u32 %__btk, %__btk, 1;\nsetp.lt.u32 %__btz, %__btk, 32;\n\
                     @%__btz bra {label};\n}}"
                );
            }
            match site.after {
                true => after_calls
                    .entry(site.call_at)
                    .or_default()
                    .push_str(&format!("\n{calls}")),
                false => edits.push((site.start, 0, format!("{calls}\n"))),
            }
        }
    }
    edits.extend(after_calls.into_iter().map(|(at, calls)| (at, 0, calls)));
    // Pushed last, so that it lands first at the body's opening (edits at one offset are
    // applied back to front): the register is declared before any probe reads it.
    if *inlining.sites > first_site && inlining.reads_sm {
        edits.push((
            kernel.body_open + 1,
            0,
            format!(
                "\n.reg .b32 {sm};\nmov.u32 {sm}, %smid;",
                sm = crate::inline::SM_REGISTER
            ),
        ));
    }
    edits
}

/// The calls of `symbols` at tensor copy `tensor` (under the statement's `guard`): for
/// each lane in turn that issues it, its map looked up in the table the host keeps
/// ([`TENSOR_MAPS_GLOBAL`]) and a call per row of the box that lies in the tensor, with
/// the row's global address and bytes (the first dimension clipped to the tensor, as
/// the copy clips it). A map not in the table (encoded where the host did not see it,
/// or changed on the device) gets no calls. `args` are the calls' `%__bta9` (the
/// access's word, size 0), `%__bta10` and `%__bta11`; `label` names this site's labels.
pub(super) fn tensor_calls(
    params: &[Param],
    tensor: &TensorBox,
    guard: Option<&str>,
    label: &str,
    args: [u64; 3],
    symbols: &[&str],
    inlining: &mut Inlining<'_>,
) -> String {
    let rank = tensor.coords.len();
    let mut p = String::from("mov.u32 %__btl, %laneid;\nsetp.eq.u32 %__btq, %__btl, %__btk;\n");
    guarded("%__btq", guard, "%__btr", &mut p);
    // The map's entry, found at the box's first row and kept for the others.
    p.push_str(&format!(
        "setp.eq.u32 %__btr, %__btj, 0;\n@!%__btr bra {label}_box;\n\
         mov.u32 %__btn, 0;\nmov.u64 %__btm, 0;\n@!%__btp bra {label}_box;\n"
    ));
    p.push_str(&format!("mov.b64 %__btt0, {};\n", tensor.map));
    p.push_str(&format!(
        "ld.global.u64 %__btt1, [{TENSOR_MAPS_GLOBAL}];\nsetp.eq.u64 %__btr, %__btt1, 0;\n\
         @%__btr bra {label}_box;\nld.u32 %__btu0, [%__btt1];\n\
         add.u64 %__btt1, %__btt1, {TENSOR_MAPS_HEAD};\n{label}_entry:\n\
         setp.eq.u32 %__btr, %__btu0, 0;\n@%__btr bra {label}_box;\n"
    ));
    for w in 0..16 {
        p.push_str(&format!(
            "ld.u64 %__btt2, [%__btt0+{o}];\nld.u64 %__btt3, [%__btt1+{o}];\n\
             setp.ne.u64 %__btr, %__btt2, %__btt3;\n@%__btr bra {label}_next;\n",
            o = w * 8
        ));
    }
    // Found: the box has the product of its other dimensions' sizes as rows.
    p.push_str("mov.u64 %__btm, %__btt1;\nmov.u32 %__btn, 1;\n");
    for d in 1..rank {
        p.push_str(&format!(
            "ld.u32 %__btu1, [%__btm+{}];\nmul.lo.u32 %__btn, %__btn, %__btu1;\n",
            224 + 4 * d
        ));
    }
    p.push_str(&format!(
        "bra {label}_box;\n{label}_next:\nadd.u64 %__btt1, %__btt1, {TENSOR_MAP_ENTRY};\n\
         sub.u32 %__btu0, %__btu0, 1;\nbra {label}_entry;\n{label}_box:\n\
         setp.ne.u64 %__btr, %__btm, 0;\nand.pred %__btp, %__btp, %__btr;\n\
         @!%__btp bra {label}_row_done;\n"
    ));
    // Row %__btj: its coordinates in the other dimensions, each inside the tensor.
    p.push_str("ld.u64 %__bta6, [%__btm+128];\nmov.u32 %__btu0, %__btj;\n");
    for (d, coord) in tensor.coords.iter().enumerate().skip(1) {
        p.push_str(&format!(
            "ld.u32 %__btu1, [%__btm+{box_at}];\nrem.u32 %__btu2, %__btu0, %__btu1;\n\
             div.u32 %__btu0, %__btu0, %__btu1;\nadd.s32 %__btu2, %__btu2, {coord};\n\
             cvt.s64.s32 %__btt2, %__btu2;\nld.u64 %__btt3, [%__btm+{dim_at}];\n\
             setp.lt.u64 %__btr, %__btt2, %__btt3;\nand.pred %__btp, %__btp, %__btr;\n\
             ld.u64 %__btt3, [%__btm+{stride_at}];\nmad.lo.s64 %__bta6, %__btt2, %__btt3, %__bta6;\n",
            box_at = 224 + 4 * d,
            dim_at = 144 + 8 * d,
            stride_at = 184 + 8 * d,
        ));
    }
    // The first dimension, clipped: elements max(c0, 0) to min(c0 + box0, dim0).
    let first = &tensor.coords[0];
    p.push_str(&format!(
        "mov.b32 %__btu2, {first};\ncvt.s64.s32 %__btt2, %__btu2;\nld.u32 %__btu1, [%__btm+224];\n\
         cvt.u64.u32 %__btt3, %__btu1;\nadd.s64 %__btt3, %__btt3, %__btt2;\n\
         ld.u64 %__btt1, [%__btm+144];\nmin.s64 %__btt3, %__btt3, %__btt1;\n\
         max.s64 %__btt2, %__btt2, 0;\nsetp.lt.s64 %__btr, %__btt2, %__btt3;\n\
         and.pred %__btp, %__btp, %__btr;\nsub.s64 %__btt3, %__btt3, %__btt2;\n\
         ld.u32 %__btu1, [%__btm+140];\ncvt.u64.u32 %__btt1, %__btu1;\n\
         mad.lo.s64 %__bta6, %__btt2, %__btt1, %__bta6;\nmul.lo.s64 %__btt3, %__btt3, %__btt1;\n\
         {label}_row_done:\n"
    ));
    let [word, site, base] = args;
    p.push_str(&format!(
        "mov.u64 %__bta7, 0;\nmov.u64 %__bta8, 0;\nor.b64 %__bta9, %__btt3, {word};\n\
         mov.u64 %__bta10, {site};\nmov.u64 %__bta11, {base};\n"
    ));
    let calls = probe_calls(params, symbols, Some("@%__btp"), Some(&p), inlining);
    format!(
        "{{\n.reg .b32 %__btk, %__btj, %__btn, %__btu<3>;\n.reg .b64 %__btm, %__btt<4>;\n\
         .reg .pred %__btz;\nmov.u32 %__btk, 0;\n{label}_lane:\nmov.u32 %__btj, 0;\n\
         {label}_row:\n{calls}\nadd.u32 %__btj, %__btj, 1;\nsetp.lt.u32 %__btz, %__btj, %__btn;\n\
         @%__btz bra {label}_row;\nadd.u32 %__btk, %__btk, 1;\nsetp.lt.u32 %__btz, %__btk, 32;\n\
         @%__btz bra {label}_lane;\n}}"
    )
}

/// PTX setting `%__btp` to predicate `pred` and, where there is one, `guard` (`@%p` or
/// `@!%p`, a statement's own), negated into `scratch`: the probe calls then run under
/// `@%__btp`.
pub(super) fn guarded(pred: &str, guard: Option<&str>, scratch: &str, out: &mut String) {
    match guard.map(|g| g.trim_start_matches('@')) {
        None if pred == "%__btp" => {}
        None => out.push_str(&format!("mov.pred %__btp, {pred};\n")),
        Some(g) => match g.strip_prefix('!') {
            Some(reg) => out.push_str(&format!(
                "not.pred {scratch}, {reg};\nand.pred %__btp, {pred}, {scratch};\n"
            )),
            None => out.push_str(&format!("and.pred %__btp, {pred}, {g};\n")),
        },
    }
}

/// A block that loads the kernel's first six parameters, widened to 64 bits (0 for the
/// ones it lacks), and calls each of `symbols` with them, under `guard` if any. With
/// `access` (PTX setting `%__bta6`..`%__bta11`, see [`AccessSite`]), the calls pass
/// those six too.
pub(super) fn probe_calls(
    params: &[Param],
    symbols: &[&str],
    guard: Option<&str>,
    access: Option<&str>,
    inlining: &mut Inlining<'_>,
) -> String {
    let count = PROBE_ARGS + if access.is_some() { ACCESS_ARGS } else { 0 };
    let mut s = format!("{{\n.reg .b64 %__bta<{count}>;\n.reg .b32 %__bth;\n.reg .b16 %__bts;\n");
    if access.is_some() {
        s.push_str(".reg .b64 %__btv;\n.reg .pred %__btp, %__btq, %__btr;\n.reg .b32 %__btl;\n");
    }
    for i in 0..PROBE_ARGS {
        let to = format!("%__bta{i}");
        let Some(p) = params.get(i) else {
            s.push_str(&format!("mov.u64 {to}, 0;\n"));
            continue;
        };
        let name = &p.name;
        match p.ty {
            ParamType::Scalar { bits: 64, .. } => {
                s.push_str(&format!("ld.param.b64 {to}, [{name}];\n"));
            }
            ParamType::Scalar { class, bits: 32 } => {
                let cvt = if class == 's' {
                    "cvt.s64.s32"
                } else {
                    "cvt.u64.u32"
                };
                s.push_str(&format!(
                    "ld.param.b32 %__bth, [{name}];\n{cvt} {to}, %__bth;\n"
                ));
            }
            ParamType::Scalar { class, bits } if bits == 16 || bits == 8 => {
                // Sub-word loads need a 16-bit or wider destination, which the load
                // extends; the conversion widens those 16 bits.
                let (load, cvt) = if class == 's' {
                    (format!("ld.param.s{bits}"), "cvt.s64.s16")
                } else {
                    (format!("ld.param.u{bits}"), "cvt.u64.u16")
                };
                s.push_str(&format!("{load} %__bts, [{name}];\n{cvt} {to}, %__bts;\n"));
            }
            ParamType::Scalar { .. } | ParamType::Bytes { .. } => {
                s.push_str(&format!(
                    "mov.u64 {to}, {name};\ncvta.param.u64 {to}, {to};\n"
                ));
            }
        }
    }
    if let Some(access) = access {
        s.push_str(access);
    }
    let args: Vec<String> = (0..count).map(|i| format!("__bt_a{i}")).collect();
    let predicate = guard;
    let guard = guard.map(|g| format!("{g} ")).unwrap_or_default();
    // Each call gets argument storage of its own: a callee may use the space of the
    // arguments it was passed, so a second call cannot count on finding them there
    // (seen on an H100: the second of two probes read a constant instead of `n`).
    for symbol in symbols {
        if let Some(body) = inlining
            .bodies
            .get(symbol)
            .filter(|b| b.statements() <= *inlining.budget)
        {
            s.push_str(&body.instantiate(*inlining.sites, predicate));
            inlining.reads_sm |= body.reads_sm();
            *inlining.sites += 1;
            *inlining.budget -= body.statements();
            continue;
        }
        s.push_str("{\n");
        for (i, a) in args.iter().enumerate() {
            s.push_str(&format!(
                ".param .b64 {a};\nst.param.b64 [{a}], %__bta{i};\n"
            ));
        }
        s.push_str(".param .b64 __bt_ret;\n");
        s.push_str(&format!(
            "{guard}call (__bt_ret), {symbol}, ({});\n}}\n",
            args.join(", ")
        ));
    }
    s.push_str("}\n");
    s
}
