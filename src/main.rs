use std::process::ExitCode;

fn main() -> ExitCode {
    nasd::cli::main()
}
