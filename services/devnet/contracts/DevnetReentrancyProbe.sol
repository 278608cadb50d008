// SPDX-License-Identifier: MIT
// TEST-ONLY helper of the devnet contract tests. Never placed by setupDevnetChain.
//
// Any call to the probe that is not one of its own functions (e.g. a token's transferFrom or a
// deposit collector's collect) makes it call `target` with `payload` once: the way a malicious token
// or collector would re-enter the contract that called it. The inner revert data is either bubbled
// up (`bubble`) or recorded in lastRevertData; the probe then answers `true` (32 bytes), which
// satisfies ERC-20 return checks.
pragma solidity ^0.8.28;

contract DevnetReentrancyProbe {
    address public target;
    bytes public payload;
    bool public bubble;
    bytes public lastRevertData;

    function arm(address target_, bytes calldata payload_, bool bubble_) external {
        target = target_;
        payload = payload_;
        bubble = bubble_;
        delete lastRevertData;
    }

    fallback(bytes calldata) external returns (bytes memory) {
        if (target != address(0)) {
            (bool ok, bytes memory ret) = target.call(payload);
            if (!ok) {
                if (bubble) {
                    assembly ("memory-safe") {
                        revert(add(ret, 0x20), mload(ret))
                    }
                }
                lastRevertData = ret;
            }
        }
        return abi.encode(true);
    }
}
