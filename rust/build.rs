//! Finds or builds the static libclattn and links it with OpenCL:
//! 1. `CLATTN_DIR`: a build folder (libclattn.a at its top, the
//!    generated header under generated/include) or an install prefix
//!    (lib/, lib64/ or lib/<multiarch>/, and include/);
//! 2. else, inside clattn's source tree, cmake builds the library into
//!    OUT_DIR (target/, never the source tree);
//! 3. else `pkg-config --static clattn`.
//!
//! The header folders go to the tests as CLATTN_INCLUDE_DIRS (':'-joined),
//! for the layout probe.
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=CLATTN_DIR");
    println!("cargo:rerun-if-changed=build.rs");
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let source = manifest.parent().map(Path::to_path_buf).unwrap_or_default();
    let (lib_dir, includes) = match env::var_os("CLATTN_DIR") {
        Some(dir) => installed(Path::new(&dir), &source),
        None if source.join("CMakeLists.txt").exists()
            && source.join("include/clattn.h").exists() =>
        {
            with_cmake(&source)
        }
        None => pkg_config(),
    };
    println!("cargo:rustc-link-search=native={}", lib_dir.display());
    println!("cargo:rustc-link-lib=static=clattn");
    println!("cargo:rustc-link-lib=dylib=OpenCL");
    println!("cargo:rustc-link-lib=dylib=pthread");
    println!("cargo:rustc-link-lib=dylib=m");
    let joined: Vec<String> = includes.iter().map(|p| p.display().to_string()).collect();
    println!("cargo:rustc-env=CLATTN_INCLUDE_DIRS={}", joined.join(":"));
    println!("cargo:include={}", joined.join(":"));
}

fn fail(message: &str) -> ! {
    eprintln!("clattn build: {message}");
    std::process::exit(1);
}

/// A build folder or an install prefix.
fn installed(dir: &Path, source: &Path) -> (PathBuf, Vec<PathBuf>) {
    let mut candidates = vec![dir.to_path_buf(), dir.join("lib"), dir.join("lib64")];
    if let Ok(entries) = std::fs::read_dir(dir.join("lib")) {
        candidates.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
    }
    let lib =
        candidates.into_iter().find(|d| d.join("libclattn.a").exists()).unwrap_or_else(|| {
            fail(&format!(
                "CLATTN_DIR={} holds no libclattn.a (in it, lib/, lib64/ or lib/*/)",
                dir.display()
            ))
        });
    println!("cargo:rerun-if-changed={}", lib.join("libclattn.a").display());
    let includes = if dir.join("include/clattn.h").exists() {
        vec![dir.join("include")]
    } else {
        vec![source.join("include"), dir.join("generated/include")]
    };
    (lib, includes)
}

/// cmake configure and build of the library alone, into OUT_DIR.
fn with_cmake(source: &Path) -> (PathBuf, Vec<PathBuf>) {
    for part in ["CMakeLists.txt", "cmake", "include", "src", "cl"] {
        println!("cargo:rerun-if-changed={}", source.join(part).display());
    }
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("cmake-build");
    let jobs = env::var("NUM_JOBS").unwrap_or_else(|_| "2".to_string());
    let configure = Command::new("cmake")
        .arg("-S")
        .arg(source)
        .arg("-B")
        .arg(&out)
        .args([
            "-DCMAKE_BUILD_TYPE=Release",
            "-DCMAKE_POSITION_INDEPENDENT_CODE=ON",
            "-DCLATTN_BUILD_TESTS=OFF",
            "-DCLATTN_BUILD_CLI=OFF",
            "-DCLATTN_BUILD_EXAMPLES=OFF",
            "-DCLATTN_BUILD_PYTHON_LIBRARY=OFF",
            "-DCLATTN_INSTALL=OFF",
        ])
        .status();
    match configure {
        Ok(s) if s.success() => {}
        Ok(s) => fail(&format!("cmake configure failed ({s})")),
        Err(e) => fail(&format!(
            "cannot run cmake ({e}): install cmake, or set CLATTN_DIR to a built or \
             installed clattn"
        )),
    }
    let build = Command::new("cmake")
        .arg("--build")
        .arg(&out)
        .args(["--target", "clattn", "-j", &jobs])
        .status();
    match build {
        Ok(s) if s.success() => {}
        Ok(s) => fail(&format!("cmake --build failed ({s})")),
        Err(e) => fail(&format!("cannot run cmake --build ({e})")),
    }
    (out.clone(), vec![source.join("include"), out.join("generated/include")])
}

/// An installed clattn that pkg-config knows.
fn pkg_config() -> (PathBuf, Vec<PathBuf>) {
    let query = |flag: &str| -> String {
        match Command::new("pkg-config").args([flag, "clattn"]).output() {
            Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_string(),
            _ => fail(
                "no clattn found: set CLATTN_DIR to a clattn build or install folder, build \
                 the crate inside clattn's source tree, or install clattn where pkg-config \
                 finds it",
            ),
        }
    };
    let lib = PathBuf::from(query("--variable=libdir"));
    let include = PathBuf::from(query("--variable=includedir"));
    (lib, vec![include])
}
