//! Which kernels a probe's pattern names: the mangled name as the module spells it, the
//! demangled signature, or the demangled name without its parameters (`vectorAdd`,
//! `tiles::matmul<16>`), each with `*` and `?` globs.

/// The names a kernel answers to, most specific first.
pub fn kernel_names(mangled: &str) -> Vec<String> {
    let mut names = vec![mangled.to_string()];
    let Ok(symbol) = cpp_demangle::Symbol::new(mangled) else {
        return names;
    };
    let Ok(full) = symbol.demangle(&cpp_demangle::DemangleOptions::default()) else {
        return names;
    };
    names.push(full.clone());
    // `void tiles::matmul<16>(float const*, ...)`: drop the parameters and, for a
    // template, the return type in front.
    let without_params = strip_params(&full);
    let base = strip_return_type(without_params);
    for n in [without_params, base] {
        if !names.iter().any(|m| m == n) {
            names.push(n.to_string());
        }
    }
    names
}

/// `name(args)` without `(args)`, minding parentheses inside template arguments.
fn strip_params(full: &str) -> &str {
    let mut depth = 0i32;
    for (i, c) in full.char_indices() {
        match c {
            '<' => depth += 1,
            '>' => depth -= 1,
            '(' if depth == 0 => return &full[..i],
            _ => {}
        }
    }
    full
}

/// `void ns::f<int>` without `void `: the last space outside template arguments.
fn strip_return_type(name: &str) -> &str {
    let mut depth = 0i32;
    let mut cut = 0;
    for (i, c) in name.char_indices() {
        match c {
            '<' => depth += 1,
            '>' => depth -= 1,
            ' ' if depth == 0 => cut = i + 1,
            _ => {}
        }
    }
    &name[cut..]
}

/// Whether `pattern` matches `text` whole: `*` any run of characters, `?` any one.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// Whether a probe on `pattern` applies to the kernel `mangled`.
pub fn matches(pattern: &str, mangled: &str) -> bool {
    kernel_names(mangled).iter().any(|n| glob_match(pattern, n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_answer_to_mangled_demangled_and_base_names() {
        assert_eq!(
            kernel_names("_Z9vectorAddPKfS0_Pfi"),
            [
                "_Z9vectorAddPKfS0_Pfi",
                "vectorAdd(float const*, float const*, float*, int)",
                "vectorAdd"
            ]
        );
        let names = kernel_names("_ZN5tiles6matmulILi16EEEvPKfS2_Pfi");
        assert!(
            names.contains(&"tiles::matmul<16>".to_string()),
            "{names:?}"
        );
        // extern "C" kernels are not mangled.
        assert_eq!(kernel_names("vec_add"), ["vec_add"]);
        assert!(matches("vectorAdd", "_Z9vectorAddPKfS0_Pfi"));
        assert!(matches("_Z9vectorAddPKfS0_Pfi", "_Z9vectorAddPKfS0_Pfi"));
        assert!(matches("*matmul*", "_ZN5tiles6matmulILi16EEEvPKfS2_Pfi"));
        assert!(matches(
            "tiles::matmul<*>",
            "_ZN5tiles6matmulILi16EEEvPKfS2_Pfi"
        ));
        assert!(!matches("vector", "_Z9vectorAddPKfS0_Pfi"));
        assert!(!matches("matmul", "_ZN5tiles6matmulILi16EEEvPKfS2_Pfi"));
    }

    #[test]
    fn globs_match_whole_names() {
        assert!(glob_match("*", ""));
        assert!(glob_match("a*c", "abbbc"));
        assert!(glob_match("a?c", "abc"));
        assert!(!glob_match("a?c", "abbc"));
        assert!(glob_match("*gemm*", "sm90_xmma_gemm_bf16"));
        assert!(!glob_match("gemm", "sgemm"));
        assert!(glob_match("*a*b*", "xxaxxbxx"));
    }
}
