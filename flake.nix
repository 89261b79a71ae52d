{
  description = "elpis: fast, lossless speculative decoding for 4-bit Qwen3.8-27B on one 24 GiB GPU";

  # The flake is a thin shell around the Makefile: the same targets, the same pinned Python environment.
  inputs = {
    nixpkgs.url = "github:NixOS/nixpkgs/nixos-24.11";
    flake-utils.url = "github:numtide/flake-utils";
  };

  outputs = { self, nixpkgs, flake-utils }:
    flake-utils.lib.eachDefaultSystem (system:
      let
        pkgs = import nixpkgs { inherit system; };
        # Tools the Makefile expects on PATH; Python packages come from pyproject.toml pins via pip.
        tools = [ pkgs.python311 pkgs.gcc pkgs.gnumake pkgs.git pkgs.cacert ];
        makeApp = target: {
          type = "app";
          program = toString (pkgs.writeShellScript "elpis-${target}" ''
            export PATH=${pkgs.lib.makeBinPath tools}:$PATH
            export SSL_CERT_FILE=${pkgs.cacert}/etc/ssl/certs/ca-bundle.crt
            exec make ${target} "$@"
          '');
        };
      in {
        devShells.default = pkgs.mkShell {
          packages = tools ++ [ pkgs.ruff pkgs.nix ];
          shellHook = ''
            export SSL_CERT_FILE=${pkgs.cacert}/etc/ssl/certs/ca-bundle.crt
            echo "elpis dev shell: make build | make test | make serve"
          '';
        };
        apps = {
          prove = makeApp "prove";
          build = makeApp "build";
          serve = makeApp "serve";
          default = makeApp "serve";
        };
      });
}
