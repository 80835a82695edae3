//! `/proc/self/maps`, parsed. The parser is a pure function so tests feed it text.

use std::path::{Path, PathBuf};

/// One line of a `/proc/<pid>/maps` text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    pub start: usize,
    pub end: usize,
    pub writable: bool,
    pub exec: bool,
    pub offset: u64,
    pub dev: (u32, u32),
    pub inode: u64,
    /// Empty for anonymous memory; `[heap]`, `[stack]` and the like for special ones.
    pub path: String,
}

impl Mapping {
    pub fn contains(&self, addr: usize) -> bool {
        (self.start..self.end).contains(&addr)
    }

    /// The file name without directories or a ` (deleted)` suffix.
    pub fn file_name(&self) -> &str {
        let p = self.path.strip_suffix(" (deleted)").unwrap_or(&self.path);
        p.rsplit('/').next().unwrap_or(p)
    }

    pub fn file_path(&self) -> Option<&Path> {
        self.path.starts_with('/').then(|| Path::new(&self.path))
    }

    /// Where file offset `off` sits in memory, if this mapping holds it.
    pub fn address_of(&self, off: u64) -> Option<usize> {
        let len = (self.end - self.start) as u64;
        (off >= self.offset && off - self.offset < len)
            .then(|| self.start + (off - self.offset) as usize)
    }
}

/// Parses a `/proc/<pid>/maps` text; lines it cannot read are skipped.
pub fn parse(text: &str) -> Vec<Mapping> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Mapping> {
    let mut fields = line.splitn(6, ' ');
    let (start, end) = fields.next()?.split_once('-')?;
    let perms = fields.next()?;
    let offset = fields.next()?;
    let (major, minor) = fields.next()?.split_once(':')?;
    let inode = fields.next()?;
    let path = fields.next().unwrap_or("").trim_start();
    Some(Mapping {
        start: usize::from_str_radix(start, 16).ok()?,
        end: usize::from_str_radix(end, 16).ok()?,
        writable: perms.as_bytes().get(1) == Some(&b'w'),
        exec: perms.as_bytes().get(2) == Some(&b'x'),
        offset: u64::from_str_radix(offset, 16).ok()?,
        dev: (
            u32::from_str_radix(major, 16).ok()?,
            u32::from_str_radix(minor, 16).ok()?,
        ),
        inode: inode.parse().ok()?,
        path: path.to_owned(),
    })
}

pub(crate) fn read_self() -> std::io::Result<Vec<Mapping>> {
    std::fs::read_to_string("/proc/self/maps").map(|t| parse(&t))
}

/// The mapped file whose name is `name` (`libc.so.6`), or, failing that, starts with `name`
/// followed by `.` or `-` (`libc` for `libc.so.6` or `libc-2.31.so`).
pub(crate) fn find_by_file_name(maps: &[Mapping], name: &str) -> Option<PathBuf> {
    let file_name = |m: &Mapping| {
        m.file_path()
            .and_then(|p| p.file_name())
            .and_then(|f| f.to_str().map(str::to_owned))
    };
    let exact = maps.iter().find(|m| file_name(m).as_deref() == Some(name));
    let prefixed = || {
        maps.iter().find(|m| {
            file_name(m).is_some_and(|f| {
                f.strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with('.') || rest.starts_with('-'))
            })
        })
    };
    exact
        .or_else(prefixed)
        .and_then(|m| m.file_path().map(Path::to_path_buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
55d0c0a00000-55d0c0a01000 r--p 00000000 fd:01 1234 /usr/bin/x
55d0c0a01000-55d0c0a05000 r-xp 00001000 fd:01 1234 /usr/bin/x
55d0c1000000-55d0c1021000 rw-p 00000000 00:00 0          [heap]
7f0000000000-7f0000001000 rw-p 00000000 00:00 0 
7f1000000000-7f1000028000 r--p 00000000 fd:01 99 /usr/lib/x86_64-linux-gnu/libc.so.6
7f1000028000-7f10001bd000 r-xp 00028000 fd:01 99 /usr/lib/x86_64-linux-gnu/libc.so.6
7f2000000000-7f2000001000 r-xp 00000000 fd:01 77 /tmp/dir with space/libz-1.2.so (deleted)
";

    #[test]
    fn parses_fields_and_paths_with_spaces() {
        let maps = parse(SAMPLE);
        assert_eq!(maps.len(), 7);
        assert_eq!(maps[1].start, 0x55d0c0a01000);
        assert!(maps[1].exec && !maps[0].exec);
        assert_eq!(maps[1].offset, 0x1000);
        assert_eq!(maps[1].dev, (0xfd, 1));
        assert_eq!(maps[1].inode, 1234);
        assert_eq!(maps[2].path, "[heap]");
        assert_eq!(maps[2].file_path(), None);
        assert_eq!(maps[3].path, "");
        assert_eq!(maps[6].path, "/tmp/dir with space/libz-1.2.so (deleted)");
        assert_eq!(maps[6].file_name(), "libz-1.2.so");
        assert_eq!(maps[5].file_name(), "libc.so.6");
        assert!(maps[2].writable && maps[3].writable);
        assert!(!maps[1].writable && !maps[4].writable);
        assert!(maps[2].contains(0x55d0c1000000) && maps[2].contains(0x55d0c1020fff));
        assert!(!maps[2].contains(0x55d0c1021000));
        // Columns padded with several spaces before the path.
        let padded = parse("7f00a000-7f00b000 r-xp 00002000 fd:01 1234     /tmp/a dir/libx.so\n");
        assert_eq!(padded[0].path, "/tmp/a dir/libx.so");
        assert_eq!(padded[0].file_name(), "libx.so");
    }

    #[test]
    fn file_offsets_map_into_the_segment_that_holds_them() {
        let maps = parse(SAMPLE);
        assert_eq!(maps[5].address_of(0x28000), Some(0x7f1000028000));
        assert_eq!(maps[5].address_of(0x30010), Some(0x7f1000030010));
        assert_eq!(maps[5].address_of(0x27fff), None);
        assert_eq!(maps[5].address_of(0x28000 + 0x195000), None);
    }

    #[test]
    fn bare_names_find_mapped_libraries() {
        let maps = parse(SAMPLE);
        let libc = Some(PathBuf::from("/usr/lib/x86_64-linux-gnu/libc.so.6"));
        assert_eq!(find_by_file_name(&maps, "libc.so.6"), libc);
        assert_eq!(find_by_file_name(&maps, "libc"), libc);
        assert_eq!(find_by_file_name(&maps, "libc.so"), libc);
        assert_eq!(find_by_file_name(&maps, "lib"), None);
        assert_eq!(
            find_by_file_name(&maps, "x"),
            Some(PathBuf::from("/usr/bin/x"))
        );
    }
}
